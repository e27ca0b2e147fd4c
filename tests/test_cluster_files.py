"""The cluster's files, checked without a cluster or an AWS account: the launcher's YAML against
Ray's schema, its placeholders refused by `seqae cluster check-launcher`, the `gpu` profiles against
the shipped GPU nodes (what a submitted job's package holds: tests/test_least_privilege.py)."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from cluster import accounts, launcher, local
from cluster.postgres import Postgres
from cluster.procs import free_port
from cluster.state import STATE, ClusterState, read_state, write_state
from seqae.cli.main import main
from seqae_errors import ConfigError
from tests.conftest import REPO

# The shipped GPU instance types: (vCPUs, GPUs), from AWS's instance-type pages
INSTANCE_TYPES = {"g5.4xlarge": (16, 1)}


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
    # the services first, so that the head (and the drivers on it) starts beside MLflow's accounts
    assert started.index("seqae cluster services") < started.index("ray start --head")
    assert f'{accounts.ACCOUNTS_ENV}="$HOME/seqae-services/secrets/{accounts.ACCOUNTS}"' in started
    assert "MLFLOW_TRACKING_PASSWORD" not in started  # no password in the head's environment
    # the versions the pages name: Python 3.11 (its venv runs every command), PostgreSQL 15, the GPU extra
    setup = config["setup_commands"]
    assert any("python3.11 -m venv ~/seqae-venv" in c for c in setup)
    assert any(c.startswith("~/seqae-venv/bin/pip install") and "/home/ubuntu/seqae[gpu" in c for c in setup)
    assert any("apt-get install -y -q postgresql-15" in c for c in config["head_setup_commands"])
    # every node's instance profile is one the IAM files describe, in the account to fill in
    profiles = {t["node_config"]["IamInstanceProfile"]["Arn"].rsplit("/", 1)[1] for t in types.values()}
    assert profiles == {"seqae-head", "seqae-worker"}


def test_check_launcher_refuses_the_shipped_files_until_every_placeholder_is_replaced(tmp_path, capsys):
    """The shipped aws.yaml, IAM policies and KubeRay manifests hold placeholders; `seqae cluster check-launcher`
    refuses each file naming every one and its lines, and passes the same files filled in, which
    Ray's schema still accepts."""
    import jsonschema
    import ray.autoscaler

    files = [
        REPO / "cluster" / "aws.yaml",
        *sorted((REPO / "cluster" / "aws-iam").glob("*.json")),
        *sorted((REPO / "cluster" / "kuberay").glob("*.yaml")),
    ]
    values = {
        "REPLACE_ME_AMI": "ami-0123456789abcdef0",
        "REPLACE_ME_ACCOUNT": "123456789012",
        "REPLACE_ME_BUCKET": "my-team-seqae",
    }
    held = set()
    for path in files:
        found = launcher.placeholders(path.read_text())
        held |= set(found)
        code, out, err = check_launcher(capsys, path)
        if found:
            assert code == 2, (code, err)
            (line,) = err.strip().splitlines()
            for name, lines in found.items():
                assert f"{name} (line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))})" in line, line
        else:
            assert code == 0 and "no placeholders left" in out
        filled = tmp_path / path.name
        text = path.read_text()
        for name, value in values.items():
            text = text.replace(name, value)
        filled.write_text(text)
        assert check_launcher(capsys, filled)[0] == 0
    assert held == set(values)  # every placeholder the files hold is one the docs tell the reader to fill
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(yaml.safe_load((tmp_path / "aws.yaml").read_text()), schema)
    # a file that is not what it claims to be is refused too, in one line
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    code, _, err = check_launcher(capsys, broken)
    assert code == 2 and "not valid JSON" in err


def check_launcher(capsys, path: Path) -> tuple[int, str, str]:
    code = main(["cluster", "check-launcher", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_gpu_profiles_fill_the_shipped_gpu_nodes():
    """Each study's `gpu` profile packs whole trials on the shipped GPU nodes (aws.yaml's worker
    type, the KubeRay worker's limits): its CPUs per trial never run out before its GPU fraction
    does, so a node runs 1/resources.gpu trials; and paper_fig3's 60 cells run at once on the
    8 nodes, as the how-to says."""
    from sweeps.spec import sweep as spec_lib

    config = yaml.safe_load((REPO / "cluster" / "aws.yaml").read_text())
    (aws_worker,) = [t for t in config["available_node_types"].values() if t.get("max_workers")]
    cluster = [
        d
        for d in yaml.safe_load_all((REPO / "cluster" / "kuberay" / "raycluster.yaml").read_text())
        if d["kind"] == "RayCluster"
    ][0]
    (group,) = cluster["spec"]["workerGroupSpecs"]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    nodes = {
        "aws.yaml": (*INSTANCE_TYPES[aws_worker["node_config"]["InstanceType"]], aws_worker["max_workers"]),
        "raycluster.yaml": (int(limits["cpu"]), int(limits["nvidia.com/gpu"]), group["maxReplicas"]),
    }
    studies = [
        p
        for p in sorted((REPO / "sweeps" / "studies").glob("*.yaml"))
        if "gpu" in (yaml.safe_load(p.read_text()).get("profiles") or {})
    ]
    assert studies
    for study in studies:
        resources = spec_lib.load(study, ["profile=gpu"]).resources
        for where, (cpus, gpus, _) in nodes.items():
            per_gpu = round(1 / resources.gpu)
            assert cpus // resources.cpu >= gpus * per_gpu, (study.name, where, cpus, resources)
    fig3 = spec_lib.load(REPO / "sweeps" / "studies" / "paper_fig3.yaml", ["profile=gpu"])
    for where, (_, gpus, most) in nodes.items():
        assert most * gpus * round(1 / fig3.resources.gpu) >= 60 and fig3.max_concurrent >= 60, where


def test_the_heads_that_keep_mlflow_artifacts_in_s3_install_boto3_through_the_s3_extra():
    """MLflow's server reaches S3 through boto3, which seqae's s3 extra installs: the launcher's
    head, whose services keep the artifacts in the bucket, and KubeRay's image install that extra."""
    import tomllib
    from packaging.requirements import Requirement

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "boto3" in {Requirement(r).name for r in extras["s3"]}
    config = yaml.safe_load((REPO / "cluster" / "aws.yaml").read_text())
    assert "--storage s3://" in " ".join(config["head_start_ray_commands"])
    installed = [
        set(extra.split(","))
        for command in config["setup_commands"] + config["head_setup_commands"]
        for extra in re.findall(r"pip install .*seqae\[([\w,]+)\]", command)
    ]
    assert any("s3" in extra for extra in installed), installed
    (image,) = re.findall(r'pip install .*"\.\[([\w,]+)\]"', (REPO / "cluster" / "kuberay" / "Dockerfile").read_text())
    assert "s3" in image.split(",")


def test_a_laptops_env_sh_and_submit_agree_on_the_cluster_side_names():
    """`add-user`'s env.sh exports the head's own values under the names `submit` hands a job."""
    from sweeps.running import submit

    assert accounts.CLUSTER_SIDE == submit.CLUSTER_SIDE


def test_add_user_beside_a_ray_started_by_hand_hands_out_that_rays_token_or_refuses_before_it_runs(
    tmp_path, monkeypatch
):
    """`services` starts no Ray: the token a user gets is the one the head's Ray keeps, where Ray
    itself looks; before `ray get-auth-token --generate` there is none, and add-user says so."""
    services = replace(cluster_state(tmp_path), ray=False)
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=r"no Ray token at .*\.ray/auth_token on this head: start Ray"):
        accounts.ray_token(services)
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("the-heads-token")
    assert accounts.ray_token(services) == "the-heads-token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").write_text("named-by-path")
    assert accounts.ray_token(services) == "named-by-path"


# cluster.json as `seqae cluster up` wrote it before its state was a record (ROOT: the cluster's folder)
STATE_OF_AN_EARLIER_UP = """{
 "root": "ROOT",
 "token_file": "ROOT/secrets/ray_token",
 "workers": 2,
 "cpus_per_worker": 1,
 "head_cpus": 0,
 "gpus_per_worker": null,
 "pass_env": [
  "HF_HUB_OFFLINE"
 ],
 "gcs_port": 41231,
 "dashboard_port": 41232,
 "node_ports": 42000,
 "mlflow": {
  "port": 41233,
  "password_file": "ROOT/secrets/mlflow_password"
 },
 "postgres": {
  "data_dir": "ROOT/postgres/data",
  "port": 41230,
  "pgpass": "ROOT/secrets/pgpass",
  "run_as": null
 },
 "storage": "ROOT/storage",
 "workspace": "ROOT/workspace",
 "pids": {
  "mlflow": 12345
 },
 "ray": true,
 "ray_temp_dir": "ROOT/ray",
 "ray_sessions": [
  12350,
  12360,
  12370
 ],
 "started": 1796000000.123456
}"""
# ... and as its first version wrote it: before --pass-env, --gpus-per-worker, the `ray start`
# sessions and MLflow's authentication, and as an `up` cut short leaves it (not yet started)
STATE_OF_A_FIRST_UP = """{
 "root": "ROOT",
 "token_file": "ROOT/secrets/ray_token",
 "workers": 2,
 "cpus_per_worker": 1,
 "head_cpus": 0,
 "gcs_port": 41231,
 "dashboard_port": 41232,
 "node_ports": 42000,
 "mlflow": {
  "port": 41233
 },
 "postgres": {
  "data_dir": "ROOT/postgres/data",
  "port": PG_PORT,
  "pgpass": "ROOT/secrets/pgpass",
  "run_as": null
 },
 "storage": "ROOT/storage",
 "workspace": "ROOT/workspace",
 "pids": {
  "mlflow": MLFLOW_PID
 },
 "ray": true,
 "ray_temp_dir": "ROOT/ray"
}"""


def cluster_state(root: Path, **fields: object) -> ClusterState:
    """The state of a cluster in ``root`` as an earlier ``up`` wrote it, with ``fields`` changed."""
    root.mkdir(parents=True, exist_ok=True)
    (root / STATE).write_text(STATE_OF_AN_EARLIER_UP.replace("ROOT", str(root)))
    state = read_state(root)
    assert state is not None
    return replace(state, **fields)


def test_the_cluster_state_an_earlier_version_wrote_reads_typed_and_writes_back_byte_for_byte(tmp_path):
    """A cluster started before its state was a record is read by this version, and the state it
    writes is the file it read, byte for byte (so the earlier version reads it too)."""
    written = STATE_OF_AN_EARLIER_UP.replace("ROOT", str(tmp_path))
    (tmp_path / STATE).write_text(written)
    state = read_state(tmp_path)
    assert state is not None and isinstance(state.postgres, Postgres)
    assert (state.mlflow.port, state.postgres.port, state.pids, state.ray_sessions) == (
        41233,
        41230,
        {"mlflow": 12345},
        [12350, 12360, 12370],
    )
    assert (
        local.environment(state)["SEQAE_OPTUNA_STORAGE"] == "postgresql+psycopg://seqae_optuna@127.0.0.1:41230/optuna"
    )
    (tmp_path / STATE).unlink()
    write_state(tmp_path, state)
    assert (tmp_path / STATE).read_text() == written
    assert read_state(tmp_path / "elsewhere") is None  # no cluster was started there


def test_a_cluster_the_first_version_started_is_read_and_stopped(tmp_path):
    """What the first versions' state lacks takes the value they meant (no names passed, the GPUs
    Ray detects, MLflow's password where `up` puts it), and `down` stops such a cluster: nothing of
    it runs here, so it says so, removes Ray's folder and records that nothing runs."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process group that no longer exists
    text = STATE_OF_A_FIRST_UP.replace("ROOT", str(tmp_path)).replace("PG_PORT", str(free_port()))
    (tmp_path / STATE).write_text(text.replace("MLFLOW_PID", str(gone.pid)))
    (tmp_path / "ray").mkdir()
    state = read_state(tmp_path)
    assert state is not None
    assert (state.pass_env, state.gpus_per_worker, state.ray_sessions, state.started) == ([], None, [], None)
    assert state.mlflow.password_file == str(tmp_path / "secrets" / "mlflow_password")
    assert local.down(tmp_path) == []
    assert not (tmp_path / "ray").exists()
    stopped = json.loads((tmp_path / STATE).read_text())
    assert (stopped["pids"], stopped["ray_sessions"], stopped["dashboard_port"]) == ({}, [], 41232)


def test_a_cluster_state_that_is_not_one_is_refused_naming_the_file_and_the_key(tmp_path):
    broken = json.loads(STATE_OF_AN_EARLIER_UP)
    del broken["dashboard_port"]
    (tmp_path / STATE).write_text(json.dumps(broken))
    with pytest.raises(
        ConfigError, match=rf"{tmp_path / STATE} is not a cluster's state: dashboard_port: Field required"
    ):
        read_state(tmp_path)
