"""docs/how-to/troubleshooting.md quotes what seqae prints: each error the page names that can be
met without Ray or a sweep is triggered here (a `seqae` command of its own, or the function that
raises), and its first line must be on the page, as printed. Paths, ports, numbers and the torch
version differ between machines, so they are read alike in both."""

from __future__ import annotations

import re
import socket
import sys

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
        f"docs/how-to/troubleshooting.md does not quote what seqae printed:\n{first_line}")


def first_error(run) -> str:  # type: ignore[no-untyped-def]
    """The line `seqae: error: ...` a refused command printed; it must be refused with exit code 2."""
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    return next(line for line in run.stderr.splitlines() if line.startswith("seqae: error: "))


def printed(exc: ConfigError) -> str:
    return f"seqae: error: {exc}"  # as seqae_cli.main prints a ConfigError


def test_a_cpu_without_bf16_says_it_trains_in_fp32(monkeypatch):
    from seqae_core import config as config_lib
    from seqae_core import train as train_lib

    monkeypatch.setattr(train_lib, "native_bf16_flags", lambda: [])
    precision = train_lib.describe_precision(config_lib.load(None, []), torch.device("cpu"))
    # the sweep's first line, as sweeps.running.driver.run writes it
    assert_quoted(f"seqae: sweep quickstart: 6 trials planned, 6 to run (data ready in 1.0 s; training in {precision})")


def test_the_hub_offline_without_a_data_path(tmp_path):
    run = seqae("sweep", "run", QUICKSTART, "--workspace", str(tmp_path / "ws"), env={"HF_HUB_OFFLINE": "1"},
                fresh=True)
    assert_quoted(first_error(run))
    assert not (tmp_path / "ws").exists()


def test_the_tokenizer_not_in_the_hub_cache(tmp_path):
    run = seqae("sweep", "run", QUICKSTART, "--workspace", str(tmp_path / "ws"), *sets(OFFLINE),
                env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache")})
    assert_quoted(first_error(run))


@pytest.mark.skipif(GPU, reason="PyTorch sees a GPU here: the error cannot happen")
def test_a_sweep_asking_for_a_gpu_that_pytorch_does_not_see(tmp_path):
    run = seqae("sweep", "run", QUICKSTART, "--workspace", str(tmp_path / "ws"), *sets(OFFLINE, "resources.gpu=0.25"),
                fresh=True)
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
        run = seqae("ui", "--workspace", str(workspace), "--mlflow-port", str(port),
                    "--optuna-port", str(free_port()), timeout=120)
    assert_quoted(first_error(run))
    assert f"--mlflow-port={port}" in run.stderr


def test_no_ray_cluster_at_ray_address(tmp_path):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    run = seqae("sweep", "run", QUICKSTART, "--workspace", str(tmp_path / "ws"), *sets(OFFLINE),
                env={"RAY_ADDRESS": address}, timeout=120)
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
