"""A trial whose node is going away (docs/explanation/resilience.md, scenario 24): its worker sent
SIGTERM mid-epoch (a spot instance's notice, Kubernetes' eviction), or its node drained with
`ray drain-node`. On a local cluster of two one-CPU worker nodes, two trials side by side, with no
retries: the trial leaves its node, continues on the other from its last checkpoint without
spending a retry, and ends with the per-validation values of an uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from seqae_core import metrics as M
from seqae_core.checkpoint import CheckpointStore
from seqae_core.config import from_flat
from seqae_core.train import train
from tests.rotation import in_turn
from tests.sweep_helpers import (
    SMOKE,
    STUDIES,
    held,
    job_driver,
    local_cluster,
    mlflow_runs,
    seqae,
    sets,
    trial_metas,
    wait_for,
)
from tests.test_cluster import assert_each_trial_once, restore_worker, wait_job

EPOCHS, VALIDATIONS = 3, 6
# Two validations an epoch, so that a checkpoint stands mid-epoch; no retries: an eviction that
# counted as a failure would fail its trial.
SWEEP = [
    *SMOKE,
    "data.max_pages=12",
    "data.input_len=16",
    "model.latent_len=8",
    f"train.epochs={EPOCHS}",
    "train.validate_every=0.5",
    "train.precision=fp32",
    "trials.total=2",
    "max_concurrent=2",
    "retries=0",
]
# what an uninterrupted run gives again to the last digit (the timings and the machine's use vary)
SAME = (
    M.EPOCH,
    M.VALIDATION,
    M.TRAIN_LOSS,
    *M.VAL_METRICS,
    *M.TEST_METRICS,
    M.LEARNING_RATE,
    M.GLOBAL_STEP,
    M.TRAIN_LOSS_STEPS,
    M.BEST_EPOCH,
    M.BEST_VAL_TOKEN_ACCURACY,
)


@pytest.mark.parametrize("repeats", [1, 2], ids=["one-seed", "two-seeds-fused"])
def test_a_run_interrupted_between_two_steps_goes_on_from_its_last_validation_unchanged(
    tiny_config, data_cache, tmp_path, repeats
):
    """What a leaving trial's worker does (sweeps.running.trial.Leaving): asked before every step,
    ``interrupt`` stops the run two steps past its first validation (mid-epoch, mid-way to the next);
    the steps since are dropped, and the run resumed from that validation's checkpoint ends with an
    uninterrupted run's values, its loss curve and dropout's random stream included."""
    from seqae_core.epoch import EpochRecord
    from seqae_core.loops import Interrupted

    config = tiny_config(
        **{
            "data.max_pages": 3,
            "train.epochs": 1,
            "train.validate_every": 0.5,
            "model.dropout": 0.1,
            "train.log_every_steps": 1,
            "train.repeats": repeats,
            "train.fuse_repeats": "on",
        }
    )
    full: list[dict[str, Any]] = []
    train(config, lambda m, c: full.append(m.as_dict()), cache_dir=data_cache)
    store = CheckpointStore(str(tmp_path / "ckpt"))
    first, asked = [], []

    def report(record: EpochRecord, checkpoint: Any) -> None:
        store.save(record, checkpoint)
        first.append(record.as_dict())

    def interrupt() -> bool:  # True from the second step after the first validation on
        asked.append(len(first))
        return asked.count(1) > 2

    with pytest.raises(Interrupted, match=r"training stopped before step \d+ of epoch 1"):
        train(config, report, cache_dir=data_cache, interrupt=interrupt)
    assert len(first) == 1 and first[0][M.EPOCH] < 1  # it left mid-epoch, past its first validation
    saved, _ = store.resume()
    rest: list[dict[str, Any]] = []
    train(config, lambda m, c: rest.append(m.as_dict()), resume=saved, cache_dir=data_cache)
    assert [{k: m.get(k) for k in SAME} for m in first + rest] == [{k: m.get(k) for k in SAME} for m in full]
    assert len(full) == 2 and all(m[M.TRAIN_LOSS_STEPS] for m in full)


# Each takes minutes on the local cluster and meets the same path (a worker's Leaving): a commit
# runs one of them (tests/rotation.py), SEQAE_ROTATION=all both.
LEAVINGS = ["sigterm", "drain"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from local_cluster(tmp_path_factory.mktemp("cluster"))


def submit(cluster, name: str) -> None:
    run = seqae(
        "sweep",
        "submit",
        str(STUDIES / "quickstart.yaml"),
        "--name",
        name,
        "--workspace",
        cluster["env"]["SEQAE_WORKSPACE"],
        *sets(*SWEEP),
        env=cluster["env"],
    )
    assert run.returncode == 0, run.stdout + run.stderr


def worker_of(storage: Path, number: int) -> psutil.Process | None:
    """The process that trains trial ``number``: the one holding its checkpoint store's writer lock."""
    lock = os.path.realpath(CheckpointStore.of_trial(str(storage), number).writer_lock)
    for process in psutil.process_iter(["cmdline"]):
        try:
            if (process.info["cmdline"] or [""])[0].startswith("ray::") and any(
                f.path == lock for f in process.open_files()
            ):
                return process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def results(storage: Path, number: int) -> list[dict[str, Any]]:
    """Trial ``number``'s results as Tune recorded them, every session's (each carries its node)."""
    lines = []
    for path in sorted(storage.glob(f"tune/session-*/trial-{number:04d}/result.json")):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines


def uninterrupted(storage: Path, number: int, cache: Path) -> list[dict[str, Any]]:
    """Trial ``number``'s results trained here from start to end, as its worker trains (one thread)."""
    saved, _ = CheckpointStore.of_trial(str(storage), number).resume()
    history: list[dict[str, Any]] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(
            from_flat(saved.config),
            lambda metrics, checkpoint: history.append(metrics.as_dict()),
            device="cpu",
            cache_dir=cache,
        )
    finally:
        torch.set_num_threads(threads)
    return history


def assert_moved_and_the_same(cluster, name: str, number: int, node_ip: str, tmp_path: Path) -> str:
    """The sweep ended with both trials complete, trial ``number`` finished on another node than
    ``node_ip`` with an uninterrupted run's values; returns the sweep's logs."""
    storage = Path(cluster["env"]["SEQAE_STORAGE"]) / name
    info = wait_job(cluster, name)
    logs = seqae("sweep", "logs", name, "--workspace", cluster["env"]["SEQAE_WORKSPACE"], env=cluster["env"]).stdout
    assert info["job"]["status"] == "SUCCEEDED", logs[-4000:]
    assert info["trials_by_state"] == {"COMPLETE": 2}, (info, logs[-4000:])  # not FAILED: no retry was spent
    assert_each_trial_once(cluster, name, 2, VALIDATIONS)  # nothing RUNNING; each validation once in Optuna and MLflow
    assert re.search(rf"trial {number}: continuing (after epoch|at step \d+ of epoch) \d", logs), logs[-4000:]
    assert f"trial {number} left a node that was going away (no retry spent)" in logs, logs[-4000:]
    nodes = [r["node_ip"] for r in results(storage, number)]
    assert nodes[0] == node_ip and nodes[-1] != node_ip, nodes  # its last epoch trained on the other node
    saved, _ = CheckpointStore.of_trial(str(storage), number).resume()
    expected = uninterrupted(storage, number, tmp_path / "cache")
    assert len(saved.history) == len(expected) == VALIDATIONS
    for got, want in zip(saved.history, expected):
        assert {k: got.get(k) for k in SAME} == {k: want.get(k) for k in SAME}
    run = next(
        r
        for r in mlflow_runs(None, name, tracking_uri=cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"])
        if r.data.tags.get("seqae.trial") == str(number)
    )
    assert run.info.status == "FINISHED"
    from mlflow.tracking import MlflowClient

    logged = MlflowClient(cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"]).get_metric_history(
        run.info.run_id, M.VAL_TOKEN_ACCURACY
    )
    assert [(m.step, m.value) for m in logged] == [(i, h[M.VAL_TOKEN_ACCURACY]) for i, h in enumerate(expected, 1)]
    return logs


def undrain(cluster, node_ip: str) -> None:
    """The node a test drained, stopped as its deadline would and started again (a drain is never lifted)."""
    from cluster import local

    raylet = local.worker_raylets(cluster["state"]).get(node_ip)
    if raylet is not None:
        os.kill(raylet, signal.SIGKILL)
        wait_for(lambda: node_ip not in local.worker_raylets(cluster["state"]), 60, f"worker {node_ip} to stop")
    restore_worker(cluster, node_ip)


@dataclass(frozen=True)
class Held:
    """A submitted sweep whose driver is held, and the trial it holds midway (``held_midway``)."""

    storage: Path
    driver: psutil.Process
    number: int
    worker: psutil.Process
    node_ip: str


def held_midway(cluster, name: str) -> Held:
    """Submits sweep ``name`` and finds a trial whose checkpoint stands at a validation with two
    more to come, with the sweep's driver held (SIGSTOP; sweep_helpers.held): Tune hands results
    over in lockstep, so the trial trains at most to its next validation and waits there, with
    steps left to train, until the caller lets the driver go on (SIGCONT to ``driver``)."""
    from cluster import local

    submit(cluster, name)
    storage = Path(cluster["env"]["SEQAE_STORAGE"]) / name
    driver, found = job_driver(name), []

    def early() -> bool:
        found[:] = [n for n, meta in trial_metas(storage).items() if 1 <= meta["epoch"] <= VALIDATIONS - 2][:1]
        return bool(found)

    wait_for(lambda: held(driver, early), 240, "a trial with two validations to go, held", every=0.05)
    worker = worker_of(storage, found[0])
    assert worker is not None
    nodes = {pid: ip for ip, pid in local.worker_raylets(cluster["state"]).items()}
    return Held(storage, driver, found[0], worker, nodes[worker.ppid()])  # a worker is its node's raylet's child


def node_id_of(cluster, node_ip: str) -> str:
    """The Ray node id of the worker node at ``node_ip``, from its raylet's command line."""
    from cluster import local

    line = psutil.Process(local.worker_raylets(cluster["state"])[node_ip]).cmdline()
    return next(a.split("=", 1)[1] for a in line if a.startswith("--node_id="))


def lines_of(logs: str, number: int) -> str:
    return "\n".join(line for line in logs.splitlines() if re.search(rf"trial {number}\b|left node", line))


@pytest.mark.slow
@in_turn("sigterm", LEAVINGS, salt=2, what="the leaving node's test")
def test_a_trial_whose_worker_gets_sigterm_mid_epoch_continues_on_another_node_unchanged(cluster, tmp_path):
    name = "sigterm"
    midway = held_midway(cluster, name)
    storage, driver, number, worker, node_ip = (
        midway.storage,
        midway.driver,
        midway.number,
        midway.worker,
        midway.node_ip,
    )
    try:
        worker.send_signal(signal.SIGTERM)
        print(
            f"SIGTERM sent to trial {number}'s worker {worker.pid} on {node_ip}, its checkpoint at validation "
            f"{trial_metas(storage)[number]['epoch']}"
        )
    finally:
        driver.send_signal(signal.SIGCONT)
    try:
        logs = assert_moved_and_the_same(cluster, name, number, node_ip, tmp_path)
    finally:
        undrain(cluster, node_ip)
    print(lines_of(logs, number))


@pytest.mark.slow
@in_turn("drain", LEAVINGS, salt=2, what="the leaving node's test")
def test_a_trial_whose_node_is_drained_continues_on_another_node_unchanged(cluster, tmp_path):
    name = "drained"
    midway = held_midway(cluster, name)
    storage, driver, number, worker, node_ip = (
        midway.storage,
        midway.driver,
        midway.number,
        midway.worker,
        midway.node_ip,
    )
    node_id = node_id_of(cluster, node_ip)
    state = cluster["state"]
    try:
        drain = subprocess.run(
            [
                "ray",
                "drain-node",
                f"--address=127.0.0.2:{state.gcs_port}",
                f"--node-id={node_id}",
                "--reason=DRAIN_NODE_REASON_PREEMPTION",
                "--reason-message=spot instance reclaimed in 120 s",
                "--deadline-remaining-seconds=120",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": state.token_file},
        )
        assert drain.returncode == 0, drain.stdout + drain.stderr
        print(
            f"drained node {node_ip} ({node_id}) with trial {number} on it, its checkpoint at validation "
            f"{trial_metas(storage)[number]['epoch']}"
        )
        said = f"seqae: trial {number}: its node is being drained"  # its worker's watcher, in the node's worker logs
        workers_logs = Path(state.ray_temp_dir)
        wait_for(
            lambda: any(
                said in p.read_text(errors="replace") for p in workers_logs.glob("session_*/logs/worker-*.out")
            ),
            60,
            "the trial's worker to see its node drained",
        )
    finally:
        driver.send_signal(signal.SIGCONT)
    stopped = []
    try:  # the deadline comes once the trial trains on another node (or, not leaving, has ended on this one)
        wait_for(
            lambda: trial_metas(storage)[number]["finished"] or worker_of(storage, number) not in (None, worker),
            240,
            f"trial {number} to leave {node_ip}",
        )
        stopped.append(undrain(cluster, node_ip))
        logs = assert_moved_and_the_same(cluster, name, number, node_ip, tmp_path)
    finally:
        if not stopped:
            undrain(cluster, node_ip)
    print(lines_of(logs, number))
