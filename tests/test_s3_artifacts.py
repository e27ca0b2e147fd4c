"""MLflow's artifacts where the team's storage is: `seqae cluster services --storage s3://...`
gives its MLflow server that bucket as its artifact root. Against the S3-compatible server the
tests run (conftest's ``s3``), a sweep tracked through that server leaves its report, its model
and its code's uncommitted changes in the bucket, and MLflow's client reads them back."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.sweep_helpers import SMOKE, seqae, sets

pytestmark = pytest.mark.slow


def bucket_keys(s3: dict[str, str], prefix: str) -> list[str]:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3["AWS_ENDPOINT_URL"],
        aws_access_key_id=s3["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=s3["AWS_SECRET_ACCESS_KEY"],
        region_name=s3["AWS_DEFAULT_REGION"],
    )
    pages = client.get_paginator("list_objects_v2").paginate(Bucket="seqae", Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def test_a_sweeps_report_model_and_code_diff_land_in_the_bucket_and_read_back_through_mlflow(s3, tmp_path, monkeypatch):
    """The sweep runs from a clone of this repository with an uncommitted change (so that it
    logs its code diff), as a user who sourced the services' env.sh and holds the admin's
    password. Its artifacts go through the MLflow server (their URIs are the server's,
    ``mlflow-artifacts:/``), which writes them to the bucket; its checkpoints go to the same
    bucket through pyarrow."""
    from mlflow.tracking import MlflowClient

    from cluster import local

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    runner = clone / "sweeps" / "running" / "runner.py"
    runner.write_text(runner.read_text() + "\n# an uncommitted change\n")

    root = tmp_path / "services"
    up = seqae(
        "cluster", "services", "--dir", str(root), "--storage", "s3://seqae/team", env=s3, cwd=tmp_path, timeout=300
    )
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        state = local.read_state(root)
        assert "storage         s3://seqae/team" in up.stdout
        env = {**local.environment(state), **local.mlflow_credentials(state), **s3}
        for key, value in local.mlflow_credentials(state).items():  # this process's MLflow client signs in too
            monkeypatch.setenv(key, value)
        run = seqae(
            "sweep",
            "run",
            str(clone / "sweeps" / "studies" / "quickstart.yaml"),
            "--name",
            "bucket",
            "--workspace",
            str(tmp_path / "ws"),
            *sets(*SMOKE, "trials.total=1"),
            env=env,
            cwd=clone,
            timeout=900,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

        keys = bucket_keys(s3, "team/mlartifacts/")
        client = MlflowClient(env["SEQAE_MLFLOW_TRACKING_URI"])
        experiment = client.get_experiment_by_name("bucket")
        runs = client.search_runs([experiment.experiment_id])
        parent = next(r for r in runs if r.data.tags.get("seqae.role") == "sweep")
        trial = next(r for r in runs if r.data.tags.get("seqae.trial") == "0")
        assert parent.info.artifact_uri.startswith("mlflow-artifacts:/")
        diff = f"provenance/code-{parent.data.tags['seqae.code']}.diff"
        under = f"team/mlartifacts/{experiment.experiment_id}"
        for artifact in (
            f"{parent.info.run_id}/artifacts/report/index.html",
            f"{parent.info.run_id}/artifacts/{diff}",
            f"{trial.info.run_id}/artifacts/samples.txt",
        ):
            assert f"{under}/{artifact}" in keys, keys
        models = client.search_logged_models([experiment.experiment_id])
        assert models and all(f"{under}/models/{m.model_id}/artifacts/MLmodel" in keys for m in models), keys
        assert bucket_keys(s3, "team/bucket/")  # the checkpoints beside them, through pyarrow

        read = Path(client.download_artifacts(parent.info.run_id, diff, str(tmp_path / "back")))
        assert "+# an uncommitted change" in read.read_text()
        page = Path(client.download_artifacts(parent.info.run_id, "report/index.html", str(tmp_path / "back")))
        assert "<html" in page.read_text().lower()
    finally:
        down = seqae("cluster", "down", "--dir", str(root), timeout=120)
        assert down.returncode == 0, down.stderr
    assert not (tmp_path / "s3:").exists() and not (REPO / "s3:").exists()  # no local folder took the bucket's place

    # the services' storage is where their runs' artifacts are: another is refused before anything starts
    moved = seqae(
        "cluster", "services", "--dir", str(root), "--storage", "elsewhere", env=s3, cwd=tmp_path, timeout=120
    )
    assert moved.returncode == 2, moved.stdout + moved.stderr
    assert (
        f"--storage {tmp_path / 'elsewhere'}: the services in {root} keep their checkpoints and MLflow's artifacts "
        "in s3://seqae/team"
    ) in moved.stderr
    assert not (tmp_path / "elsewhere").exists()
