"""Shared fixtures: the offline data in ``../shared`` and a tiny CPU config."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from seqae_core.epoch import EpochRecord
from tests.receiver import receiver  # noqa: F401 - the webhook fixture every test module may ask for

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SEQAE_SHARED", REPO.parent / "shared")).resolve()
WIKI_MINI = SHARED / "data" / "wikipedia-mini"

# The real loading code runs against the offline copies: the tokenizer from a hub cache, the
# pages from a folder in the layout of wikimedia/wikipedia.
os.environ.setdefault("HF_HUB_CACHE", str(SHARED / "hf" / "hub"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# A model small enough to train in seconds on two cores, on real Wikipedia text.
TINY = {
    "data.path": str(WIKI_MINI),
    "data.samples": "windows",
    "data.input_len": 16,
    "data.max_pages": 6,
    "model.block": "transformer",
    "model.d_model": 32,
    "model.d_attn": 32,
    "model.heads": 2,
    "model.d_ffn": 64,
    "train.epochs": 2,
    "train.batch_size": 32,
    "data.vocab": "corpus",  # the head scores the ids these pages use: a tenth of the steps' cost
}


# The files whose tests start the local cluster on the fixed loopback addresses, one cluster at a
# time (tests/sweep_helpers.py::local_cluster and its lock). pytest-xdist gives them to one of its two
# processes as one unit of work, first, while the other process runs the rest: split by file across
# both, one waited on the other's cluster (docs/explanation/performance.md, "The local-cluster files
# in one process").
LOCAL_CLUSTER = ["test_chaos.py", "test_cluster.py", "test_logical_gpus.py", "test_sharing.py", "test_eviction.py"]
# The other files that take longest in .ci/run (its --durations, on 2 cores), longest first; the
# rest follow in name order.
LONGEST_FIRST = [
    "test_own_machines.py",
    "test_resilience.py",
    "test_control.py",
    "test_dashboards.py",
    "test_sweeps.py",
    "test_provenance.py",
    "test_move.py",
    "test_scale.py",
    "test_mlflow_auth.py",
    "test_s3_artifacts.py",
    "test_ownership.py",
    "test_notify.py",
    "test_api.py",
    "test_textmodel.py",
]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduling by file (its module fixtures are built once), with the local-cluster
    files one unit. (Its own ``--dist=loadgroup`` marks no longer reach its scheduler under pytest
    9, which keeps a test's id apart from the attribute pytest-xdist rewrites.)"""
    from xdist.scheduler import LoadScopeScheduling

    class LocalClusterApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "local-cluster" if Path(path).name in LOCAL_CLUSTER else path

    return LocalClusterApart(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LOCAL_CLUSTER + LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests stay in order
    import torch  # the suite's tests import it anyway; here only to ask whether CUDA is there

    if not torch.cuda.is_available():  # one reason, shown once by -ra for every GPU test
        no_gpu = pytest.mark.skip(reason="needs CUDA: torch sees no GPU here (each has a CPU twin that ran)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(no_gpu)


def sets(overrides: dict) -> list[str]:
    """``{"a.b": 1}`` -> ``["a.b=1"]`` for ``--set``."""
    return [f"{k}={v}" for k, v in overrides.items()]


def epoch_record(**fields: Any) -> EpochRecord:
    """A validation's record as training makes it, with plausible values but for ``fields``."""
    return EpochRecord(
        **{
            "epoch": 1,
            "validation": int(math.ceil(fields.get("epoch", 1))),
            "train_loss": 2.5,
            "val_loss": 2.0,
            "val_token_accuracy": 0.5,
            "val_sequence_accuracy": 0.0,
            "lr": 1e-3,
            "tokens_per_s": 1000.0,
            "epoch_seconds": 3.0,
            "epoch_cpu_seconds": 5.0,
            "validation_cpu_seconds": 0.5,
            "latent_fraction": 0.5,
            "latent_floats": 256,
            "latent_share": 0.5,
            "best_epoch": 1,
            "best_val_token_accuracy": 0.5,
            "data_seconds": 0.1,
            "global_step": 9,
            "train_loss_steps": ((9, 2.5),),
            **fields,
        }
    )


@pytest.fixture(scope="session", autouse=True)
def threads_per_worker() -> None:
    """pytest-xdist's workers share the cores: workers that train in-process (or through `seqae
    train`) with as many threads as the machine has cores make their OpenMP threads take turns
    spinning (the fast tier took 5m36s instead of 2m51s on 2 cores). A sweep's trials set
    their own threads from resources.cpu. (xdist names the worker count only once conftest is
    imported, hence a fixture.)"""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    if "torch" in sys.modules:  # otherwise torch reads OMP_NUM_THREADS when it is imported
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tokenized-data cache for the whole session, as a sweep's trials share one."""
    if not WIKI_MINI.exists():
        pytest.fail(f"the offline data is missing: {WIKI_MINI} (set SEQAE_SHARED)")
    return tmp_path_factory.mktemp("data-cache")


@pytest.fixture(scope="module", autouse=True)
def mlflow_uris_stay_in_their_module():
    """``mlflow.set_tracking_uri``/``set_registry_uri`` (called by in-process tests and the product
    code they run) set process globals and MLFLOW_*_URI environment variables: without this, the
    next module's ``MlflowClient(uri)`` would look models up in another test's registry, and every
    process its tests start would inherit that test's URIs."""
    _forget_mlflow_uris()
    yield
    _forget_mlflow_uris()


@pytest.fixture(scope="module", autouse=True)
def no_local_ray_after_the_module():
    yield
    stop_local_ray()


def stop_local_ray() -> None:
    """Shut down the local Ray an in-process driver left running, if any. An idle local Ray takes
    about 5 CPU-seconds a minute (its GCS, raylet, agents and idle workers) from the trials on the
    machine's two cores, and a driver in another process starts a Ray of its own beside it: called
    before such a driver or a cluster starts, and after each test module (below)."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


def _forget_mlflow_uris() -> None:
    if "mlflow" in sys.modules:
        sys.modules["mlflow"].set_tracking_uri(None)
        sys.modules["mlflow"].set_registry_uri(None)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        os.environ.pop(name, None)


@pytest.fixture
def tiny_config():
    """The tiny config, with optional overrides: ``tiny_config(**{"model.block": "paper"})``."""
    from seqae_core.config import from_flat

    def make(**overrides):
        return from_flat({**TINY, **overrides}, "tiny config")

    return make


SCREENSHOTS: list[str] = []


@pytest.fixture
def screenshot_dir() -> Path:
    """Where browser tests save screenshots; the test summary lists every file saved there."""
    folder = Path(os.environ.get("SEQAE_SCREENSHOTS", REPO / "test-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def s3():
    """A real S3-compatible server (moto's) on loopback, with a bucket ``seqae``: yields the
    environment that points pyarrow's and boto3's S3 clients at it."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request in a failure's report
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "seqae-test",
        "AWS_SECRET_ACCESS_KEY": "seqae-test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    import boto3

    boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id="seqae-test",
        aws_secret_access_key="seqae-test",
        region_name="us-east-1",
    ).create_bucket(Bucket="seqae")
    try:
        yield env
    finally:
        server.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The screenshots browser tests saved (in this process), and the chaos soak's line (its seed,
    faults and drivers) at the end of every run that soaked one, also from a pytest-xdist worker."""
    if SCREENSHOTS:
        terminalreporter.write_sep("-", "screenshots saved")
        for path in SCREENSHOTS:
            terminalreporter.write_line(path)
    for report in terminalreporter.stats.get("passed", []):
        for key, line in getattr(report, "user_properties", []):
            if key == "chaos" and report.when == "call":
                terminalreporter.write_line(line)
