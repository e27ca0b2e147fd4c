"""The cluster's files, checked without a cluster: the launcher's YAML against Ray's schema (what a
submitted job's package holds: tests/test_least_privilege.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.conftest import REPO


def test_cluster_launcher_yaml_matches_rays_schema():
    import jsonschema
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    config = yaml.safe_load((REPO / "cluster" / "aws.yaml").read_text())
    jsonschema.validate(config, schema)
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"] == {"CPU": 0}
    assert any("g5" in t["node_config"]["InstanceType"] for t in types.values())  # a GPU worker group
    started = " ".join(config["head_start_ray_commands"])
    assert "RAY_AUTH_MODE=token" in started and "--dashboard-host=127.0.0.1" in started
    # the services first, so that the head (and the drivers on it) starts with MLflow's credentials
    assert started.index("seqae cluster services") < started.index("ray start --head")
    assert 'MLFLOW_TRACKING_PASSWORD="$(cat ~/seqae-services/secrets/mlflow_password)"' in started
