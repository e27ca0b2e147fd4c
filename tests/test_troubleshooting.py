"""docs/how-to/troubleshooting.md quotes what seqae prints: each error the page names that can be
met without a sweep is triggered here (a `seqae` command of its own, or the function that raises;
the Jobs API's refusals against a Ray head of their own), and its first line must be on the page,
as printed. Paths, ports, numbers and the torch version differ between machines, so they are read
alike in both."""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path

import pytest
import torch

from cluster.procs import free_port
from seqae_errors import ConfigError
from tests.conftest import REPO, WIKI_MINI
from tests.sweep_helpers import STUDIES, seqae, sets

PAGE = REPO / "docs" / "how-to" / "troubleshooting.md"
QUICKSTART = str(STUDIES / "quickstart.yaml")
OFFLINE = f"data.path={WIKI_MINI}"
PAGE_REPO = "/home/me/seqae"  # where the page's quoted lines have the repository
GPU = torch.cuda.is_available()


def alike(text: str) -> str:
    """``text`` with what differs between machines made the same: this checkout's path, the
    installed torch's version, and every number."""
    text = text.replace(str(REPO), PAGE_REPO).replace(torch.__version__, "2.13.0+cpu")
    return re.sub(r"\d+", "N", text)


def quoted() -> list[str]:
    """The lines of the page's ``text`` blocks, as :func:`alike` reads them."""
    blocks = re.findall(r"```text\n(.*?)```", PAGE.read_text(), re.S)
    return [alike(line) for block in blocks for line in block.splitlines()]


def assert_quoted(first_line: str) -> None:
    lines = quoted()
    said = alike(first_line)
    assert said in lines or any(re.fullmatch(re.escape(line).replace(r"\.\.\.", ".*"), said) for line in lines), (
        f"docs/how-to/troubleshooting.md does not quote what seqae printed:\n{first_line}"
    )


def first_error(run) -> str:  # type: ignore[no-untyped-def]
    """The line `seqae: error: ...` a refused command printed; it must be refused with exit code 2."""
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    return next(line for line in run.stderr.splitlines() if line.startswith("seqae: error: "))


def printed(exc: ConfigError) -> str:
    return f"seqae: error: {exc}"  # as seqae.cli.main prints a ConfigError


def test_a_cpu_without_bf16_says_it_trains_in_fp32(monkeypatch):
    from seqae_core import config as config_lib
    from seqae_core import device as device_lib

    monkeypatch.setattr(device_lib, "native_bf16_flags", lambda: [])
    precision = device_lib.describe_precision(config_lib.load(None, []), torch.device("cpu"))
    # the sweep's first line, as sweeps.running.driver.run writes it
    assert_quoted(f"seqae: sweep quickstart: 6 trials planned, 6 to run (data ready in 1.0 s; training in {precision})")


def test_the_hub_offline_without_a_data_path(tmp_path):
    run = seqae(
        "sweep", "run", QUICKSTART, "--workspace", str(tmp_path / "ws"), env={"HF_HUB_OFFLINE": "1"}, fresh=True
    )
    assert_quoted(first_error(run))
    assert not (tmp_path / "ws").exists()


def test_the_tokenizer_not_in_the_hub_cache(tmp_path):
    run = seqae(
        "sweep",
        "run",
        QUICKSTART,
        "--workspace",
        str(tmp_path / "ws"),
        *sets(OFFLINE),
        env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache")},
    )
    assert_quoted(first_error(run))


@pytest.mark.skipif(GPU, reason="PyTorch sees a GPU here: the error cannot happen")
def test_a_sweep_asking_for_a_gpu_that_pytorch_does_not_see(tmp_path):
    run = seqae(
        "sweep",
        "run",
        QUICKSTART,
        "--workspace",
        str(tmp_path / "ws"),
        *sets(OFFLINE, "resources.gpu=0.25"),
        fresh=True,
    )
    assert_quoted(first_error(run))
    assert not (tmp_path / "ws").exists()


@pytest.mark.skipif(GPU, reason="PyTorch sees a GPU here: the error cannot happen")
def test_training_on_a_cuda_device_that_pytorch_does_not_see():
    run = seqae("train", "--device", "cuda", *sets(OFFLINE), fresh=True)
    assert_quoted(first_error(run))


def test_postgresql_missing(monkeypatch, tmp_path):
    from cluster import postgres

    monkeypatch.setattr(postgres.shutil, "which", lambda name: None)  # no pg_config, no pg_ctl on PATH
    monkeypatch.setattr(postgres, "DEBIAN_VERSIONS", tmp_path)  # and no Debian server
    with pytest.raises(ConfigError) as refused:
        postgres.bindir()
    assert_quoted(printed(refused.value))


def test_a_port_in_use(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "mlflow.db").touch()  # a workspace where a sweep has run
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = seqae(
            "ui",
            "--workspace",
            str(workspace),
            "--mlflow-port",
            str(port),
            "--optuna-port",
            str(free_port()),
            timeout=120,
        )
    assert_quoted(first_error(run))
    assert f"--mlflow-port={port}" in run.stderr


def test_no_ray_cluster_at_ray_address(tmp_path):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    run = seqae(
        "sweep",
        "run",
        QUICKSTART,
        "--workspace",
        str(tmp_path / "ws"),
        *sets(OFFLINE),
        env={"RAY_ADDRESS": address},
        timeout=120,
    )
    assert_quoted(first_error(run))
    assert f"RAY_ADDRESS={address!r}" in run.stderr


def test_services_with_an_s3_storage_without_boto3(monkeypatch, tmp_path):
    from cluster import local

    monkeypatch.setitem(sys.modules, "boto3", None)  # as where the s3 extra is not installed: import fails
    with pytest.raises(ConfigError) as refused:
        local.up(tmp_path / "services", ray=False, storage="s3://your-bucket/sweeps")
    assert_quoted(printed(refused.value))
    assert '".[s3]"' in str(refused.value) and not (tmp_path / "services").exists()  # nothing started


def test_services_with_an_s3_storage_the_credentials_do_not_reach(s3, monkeypatch, tmp_path):
    """The S3-compatible server answers, but there is no such bucket: as a wrong name, key or
    policy, the listing is refused before PostgreSQL or MLflow starts."""
    from cluster import local

    for key, value in s3.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as refused:
        local.up(tmp_path / "services", ray=False, storage="s3://your-bucket/sweeps")  # no such bucket there
    assert_quoted(printed(refused.value))
    assert "NoSuchBucket" in str(refused.value) and not (tmp_path / "services").exists()


def _refused_submission(
    tmp_path, monkeypatch, file: str = QUICKSTART, url: str | None = "http://127.0.0.1:8265", **env: str
) -> str:
    """What `seqae sweep submit FILE` prints where it refuses before contacting the cluster, with
    ``env`` as the shell's SEQAE_* settings (servers for both backends unless given)."""
    from sweeps.running import submit
    from sweeps.stores.workspace import Workspace

    monkeypatch.chdir(REPO)
    for key in ("SEQAE_RAY_ADDRESS", "SEQAE_MLFLOW_TRACKING_URI", "SEQAE_OPTUNA_STORAGE", "SEQAE_WORKSPACE"):
        monkeypatch.delenv(key, raising=False)
    servers = {
        "SEQAE_MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "SEQAE_OPTUNA_STORAGE": "postgresql://seqae@127.0.0.1:5432/optuna",
    }
    for key, value in {**servers, **env}.items():
        monkeypatch.setenv(key, value)
    workspace = Workspace(tmp_path / "ws")
    with pytest.raises(ConfigError) as refused:
        submit.submit(workspace, file, None, [], url)
    assert not (tmp_path / "ws" / "sweeps" / "quickstart").exists()  # nothing recorded
    return printed(refused.value)


def test_submit_without_a_cluster_address(tmp_path, monkeypatch):
    assert_quoted(_refused_submission(tmp_path, monkeypatch, url=None))


def test_submit_to_an_address_that_is_not_the_dashboards_url(tmp_path, monkeypatch):
    assert_quoted(_refused_submission(tmp_path, monkeypatch, url="10.0.0.5:8265"))


def test_submit_with_sqlite_backends(tmp_path, monkeypatch):
    # a shell with neither server set: a sweep's SQLite defaults
    assert_quoted(_refused_submission(tmp_path, monkeypatch, SEQAE_MLFLOW_TRACKING_URI="", SEQAE_OPTUNA_STORAGE=""))


def test_submit_a_sweep_file_outside_the_working_directory(tmp_path, monkeypatch):
    outside = tmp_path / "studies" / "quickstart.yaml"
    outside.parent.mkdir()
    outside.write_text(Path(QUICKSTART).read_text())
    said = _refused_submission(tmp_path, monkeypatch, file=str(outside))
    assert_quoted(said.replace(str(tmp_path), "/home/me"))  # as the page's /home/me/studies/quickstart.yaml


def test_submit_under_a_name_already_taken(tmp_path, monkeypatch):
    from sweeps.stores.workspace import Submission, Workspace

    Workspace(tmp_path / "ws").write_submission(
        Submission(
            name="quickstart",
            address="http://127.0.0.1:8265",
            file="sweeps/studies/quickstart.yaml",
            sets=[],
            workspace=str(tmp_path / "ws"),
            working_dir=str(REPO),
        )
    )
    from sweeps.running import submit

    monkeypatch.setenv("SEQAE_MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    monkeypatch.setenv("SEQAE_OPTUNA_STORAGE", "postgresql://seqae@127.0.0.1:5432/optuna")
    with pytest.raises(ConfigError) as refused:
        submit.submit(Workspace(tmp_path / "ws"), QUICKSTART, None, [], "http://127.0.0.1:8265")
    assert_quoted(printed(refused.value))


@pytest.mark.slow
def test_the_jobs_api_without_the_clusters_token(tmp_path):
    """A Ray head with token authentication (as `seqae cluster up` and the how-to start it): a
    submission with no token, and one with another cluster's, are refused in one line each."""
    import subprocess
    import tempfile

    import psutil

    from cluster import local
    from cluster.procs import http_ok, wait_until

    token = tmp_path / "ray_token"
    token.write_text("the-clusters-own-token")
    temp_dir = tempfile.mkdtemp(prefix="seqae-ray-")  # short: Ray's socket paths are limited
    dashboard, log = free_port(), tmp_path / "ray-head.log"
    head = subprocess.Popen(
        [
            local._ray_bin(),
            "start",
            "--head",
            f"--port={free_port()}",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            f"--temp-dir={temp_dir}",
            "--num-cpus=0",
            f"--ray-client-server-port={free_port()}",
            "--disable-usage-stats",
        ],
        env={**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert head.wait(timeout=180) == 0, log.read_text(errors="replace")[-2000:]
        url = f"http://127.0.0.1:{dashboard}"
        wait_until(lambda: http_ok(f"{url}/api/gcs_healthz"), 60, "the Ray dashboard", log)
        servers = {
            "SEQAE_MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
            "RAY_AUTH_MODE": "token",
            "SEQAE_OPTUNA_STORAGE": "postgresql://seqae@127.0.0.1:5432/optuna",
            "HOME": str(tmp_path),
        }
        wrong = tmp_path / "other_token"
        wrong.write_text("another-clusters-token")
        no_token = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
        # no token: Ray's client refuses to send the request (RAY_AUTH_MODE=token, as env.sh sets),
        # or the cluster answers 401 (RAY_AUTH_MODE unset); the wrong one: 403
        for name, env, unset in (
            ("none", {}, no_token),
            ("none-401", {}, (*no_token, "RAY_AUTH_MODE")),
            ("wrong", {"RAY_AUTH_TOKEN_PATH": str(wrong)}, ("RAY_AUTH_TOKEN",)),
        ):
            run = seqae(
                "sweep",
                "submit",
                QUICKSTART,
                "--name",
                name,
                "--address",
                url,
                "--workspace",
                str(tmp_path / "ws"),
                env={**servers, **env},
                unset=unset,
                timeout=120,
            )
            said = first_error(run)
            assert_quoted(said.replace(str(wrong), "/home/me/old-cluster/secrets/ray_token"))
            assert not (tmp_path / "ws" / "sweeps" / name).exists()
    finally:
        procs = local.ray_processes(temp_dir, [head.pid])
        for proc in procs:
            proc.terminate()
        for proc in psutil.wait_procs(procs, timeout=15)[1]:
            proc.kill()


def test_a_gpu_sweep_on_a_cluster_without_gpu_nodes(monkeypatch):
    """The check a submitted sweep's driver makes on the cluster, which reads the sweep file by
    the path `submit` recorded, relative to the job's working directory."""
    from sweeps.running.ray_connection import check_resources
    from sweeps.spec import sweep as spec_lib

    monkeypatch.chdir(REPO)
    spec = spec_lib.load("sweeps/studies/quickstart.yaml", ["resources.gpu=0.25"])
    with pytest.raises(ConfigError) as refused:
        check_resources(spec, 8.0, 0.0)  # the largest alive node: 8 CPUs, no GPU
    assert_quoted(printed(refused.value))


def test_a_priority_change_of_anothers_sweep(tmp_path, monkeypatch, capsys):
    from seqae.cli.main import main
    from sweeps.stores.ownership import USER
    from sweeps.stores.queue import Entry, Queue

    monkeypatch.delenv("SEQAE_OPTUNA_STORAGE", raising=False)
    Queue(f"sqlite:///{tmp_path / 'optuna.db'}").join(
        Entry("hers", "ann", 0, 4, 4, 1.0, 0.0, 0, 0, 0, 0, 8, 0.0, 0.0, None, 4.0, 0.0)
    )
    monkeypatch.setenv(USER, "bob")
    assert main(["sweep", "priority", "hers", "9", "--workspace", str(tmp_path)]) == 2
    assert_quoted(next(line for line in capsys.readouterr().err.splitlines() if line.startswith("seqae: error: ")))
