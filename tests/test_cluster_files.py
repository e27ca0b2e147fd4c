"""The cluster's files, checked without a cluster: the launcher's YAML against Ray's schema (what a
submitted job's package holds: tests/test_least_privilege.py)."""

from __future__ import annotations

import json
import re
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


def test_the_heads_that_keep_mlflow_artifacts_in_s3_install_boto3_through_the_s3_extra():
    """MLflow's server reaches S3 through boto3, which seqae's s3 extra installs: the launcher's
    head, whose services keep the artifacts in the bucket, and KubeRay's image install that extra."""
    import tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "boto3" in {Requirement(r).name for r in extras["s3"]}
    config = yaml.safe_load((REPO / "cluster" / "aws.yaml").read_text())
    assert "--storage s3://" in " ".join(config["head_start_ray_commands"])
    installed = [set(extra.split(",")) for command in config["setup_commands"] + config["head_setup_commands"]
                 for extra in re.findall(r'pip install .*seqae\[([\w,]+)\]', command)]
    assert any("s3" in extra for extra in installed), installed
    (image,) = re.findall(r'pip install .*"\.\[([\w,]+)\]"', (REPO / "cluster" / "kuberay" / "Dockerfile").read_text())
    assert "s3" in image.split(",")
