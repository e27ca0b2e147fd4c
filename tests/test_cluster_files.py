"""The cluster's files, checked without a cluster: the launcher's YAML against Ray's schema, and
what a submitted job's package leaves out."""

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


def test_cluster_state_inside_the_working_directory_is_never_packaged(tmp_path, monkeypatch):
    """`seqae cluster up --dir .seqae-cluster` in the repository keeps the token, the pgpass file
    and PostgreSQL's data there; a submitted job's package must leave all of it out."""
    from ray._private.runtime_env.packaging import _get_excludes

    from sweeps.running.submit import excludes

    state = tmp_path / ".seqae-cluster"
    monkeypatch.setenv("PGPASSFILE", str(state / "secrets" / "pgpass"))
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(state / "secrets" / "ray_token"))
    monkeypatch.setenv("SEQAE_STORAGE", "/elsewhere/storage")  # outside: nothing to exclude
    patterns = excludes(tmp_path)
    assert "/.seqae-cluster" in patterns and not any("elsewhere" in p for p in patterns)
    skipped = _get_excludes(tmp_path, patterns)  # Ray's own matcher for runtime_env excludes
    assert skipped(state / "postgres" / "PG_VERSION") and skipped(state / "secrets" / "pgpass")
    assert not skipped(tmp_path / "sweeps" / "studies" / "quickstart.yaml")
