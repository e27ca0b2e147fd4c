"""GPU scheduling rehearsed without a GPU: worker raylets given logical GPUs (`seqae cluster up
--gpus-per-worker N`, `ray start --num-gpus=N`), and trials that train on the CPU only where the
sweep opts in (SEQAE_LOGICAL_GPUS=1), saying so; without it such a trial fails, naming the setting.

The fast tests check the pieces on their own; the slow ones run the rehearsal on a real local
cluster: Ray packs four 0.25-GPU trials onto each logical GPU, each trial records the GPU Ray
assigned it, its cost counts in GPU-hours and a GPU-hours budget stops a sweep."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray
import torch

from benchmarks.gpu_packing import at_once, trials_at_once_per_gpu
from cluster import local
from seqae.cli.parser import build_parser
from seqae_core import device as device_lib
from seqae_core import names as N
from seqae_core.checkpoint import CheckpointStore
from seqae_errors import ConfigError
from sweeps.running.ray_connection import check_resources
from sweeps.running.trial import LOGICAL_GPUS, Runtime, _train_trial, trial_device
from sweeps.spec import sweep as spec_lib
from tests.sweep_helpers import STUDIES, local_cluster, mlflow_runs, seqae, trial_metas, wait_for
from tests.test_cluster import submit, wait_job  # the cluster tests' submission, on their tiny settings
from tests.test_cluster_files import cluster_state

# -- the pieces, fast ----------------------------------------------------------------------------


def test_worker_raylets_get_the_gpus_asked_for_and_otherwise_those_ray_detects(tmp_path, monkeypatch):
    assert "--num-gpus=2" in local.node_args("127.0.0.3", 20000, 8, 2)
    assert not any(a.startswith("--num-gpus") for a in local.node_args("127.0.0.3", 20000, 8))
    assert build_parser().parse_args(["cluster", "up", "--gpus-per-worker", "2"]).gpus_per_worker == 2
    assert build_parser().parse_args(["cluster", "up"]).gpus_per_worker is None
    # a worker started again after it was lost gets the GPUs the cluster's state records
    started = []
    monkeypatch.setattr(local, "_ray_start", lambda state, argv, env, log: started.append(argv))
    state = cluster_state(tmp_path, cpus_per_worker=8, gpus_per_worker=2)
    local.start_worker(state, 1)
    assert "--num-gpus=2" in started[0] and "--num-cpus=8" in started[0] and "--node-ip-address=127.0.0.3" in started[0]
    with pytest.raises(ConfigError, match=r"--gpus-per-worker=-1 must be 0 or more"):
        local.up(tmp_path / "c", gpus_per_worker=-1)
    assert not (tmp_path / "c").exists()  # refused before anything was created


@pytest.fixture
def ray_gave(monkeypatch):
    """A trial's view of its node: the GPU ids Ray assigned it, and whether torch finds CUDA."""

    def give(ids: list[int], cuda: bool) -> None:
        monkeypatch.setattr(ray, "get_gpu_ids", lambda: ids)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, ids)))  # as Ray sets it

    monkeypatch.delenv(LOGICAL_GPUS, raising=False)
    monkeypatch.setattr(device_lib, "native_bf16_flags", lambda: [])  # the message's precision, on any CPU
    return give


def test_with_cuda_faked_a_trial_without_gpus_trains_on_the_cpu_and_one_given_a_gpu_on_cuda(
    ray_gave, tiny_config, capsys
):
    """torch.cuda.is_available and Ray's GPU ids are faked here (no GPU needed): this checks the
    choice of device, not CUDA; tests/test_gpu.py trains on a real one."""
    ray_gave([], cuda=True)
    assert trial_device(0, tiny_config()) == ("cpu", {})
    ray_gave([1], cuda=True)
    assert trial_device(0, tiny_config()) == ("cuda", {"gpu": "cuda", "gpu_ids": "1", "cuda_visible_devices": "1"})
    assert capsys.readouterr().out == ""


def test_a_trial_given_a_logical_gpu_fails_without_the_opt_in(ray_gave, tiny_config, tmp_path):
    """Never a silent CPU fallback: the trial fails before it trains, naming the GPU and the setting."""
    ray_gave([1], cuda=False)
    expected = (
        r"trial 3: Ray assigned it GPU 1 \(CUDA_VISIBLE_DEVICES=1\), but torch finds no CUDA device on "
        r"this node: the GPU is logical .* set SEQAE_LOGICAL_GPUS=1 to rehearse GPU scheduling"
    )
    with pytest.raises(ConfigError, match=expected):
        trial_device(3, tiny_config())
    # the trial function itself refuses, before anything is trained or saved
    store = CheckpointStore.of_trial(str(tmp_path / "storage"), 3)
    with pytest.raises(ConfigError, match=expected):
        _train_trial(3, tiny_config(), store, Runtime(str(tmp_path / "records"), str(tmp_path), {}), False)
    assert store.progress() is None


def test_with_the_opt_in_a_trial_given_a_logical_gpu_trains_on_the_cpu_and_says_so(
    ray_gave, tiny_config, monkeypatch, capsys
):
    ray_gave([1], cuda=False)
    monkeypatch.setenv(LOGICAL_GPUS, "1")
    assert trial_device(3, tiny_config()) == ("cpu", {"gpu": "logical", "gpu_ids": "1", "cuda_visible_devices": "1"})
    said = capsys.readouterr().out
    assert said == (
        "seqae: trial 3: Ray assigned it GPU 1 (CUDA_VISIBLE_DEVICES=1), a logical GPU: this node has "
        "no CUDA device, so it trains on the CPU instead, in fp32 (this CPU has no native bf16); "
        "SEQAE_LOGICAL_GPUS=1 makes it a rehearsal of GPU scheduling, its cost counted in GPU-hours\n"
    )
    # a real GPU is used where there is one, opt-in or not
    ray_gave([1], cuda=True)
    assert trial_device(3, tiny_config())[0] == "cuda"


def test_a_gpu_sweep_is_still_refused_where_ray_counts_no_gpus_even_with_the_opt_in(monkeypatch):
    monkeypatch.setenv(LOGICAL_GPUS, "1")
    spec = spec_lib.load(STUDIES / "quickstart.yaml", ["resources.gpu=0.25"])
    with pytest.raises(
        ConfigError,
        match=r"resources.gpu=0.25 per trial, but no GPU is available.*"
        r"`seqae cluster up --gpus-per-worker N`",
    ):
        check_resources(spec, 2.0, 0.0)
    check_resources(spec, 2.0, 2.0)  # logical GPUs count as Ray counts them


def _run(trial: int, node: str, gpus: str, start: float, end: float | None) -> SimpleNamespace:
    tags = {N.TRIAL: str(trial), "ray.node_ip": node, N.GPU_IDS: gpus}
    return SimpleNamespace(data=SimpleNamespace(tags=tags), info=SimpleNamespace(start_time=start, end_time=end))


def test_trials_at_once_are_counted_per_node_and_gpu_from_their_runs():
    assert at_once([]) == 0 and at_once([(0, 2), (1, 3), (2, 4)]) == 2  # one ending as another starts: apart
    runs = [
        _run(0, "127.0.0.3", "0", 0, 10),
        _run(1, "127.0.0.3", "0", 1, 5),
        _run(2, "127.0.0.3", "0", 5, 9),
        _run(3, "127.0.0.3", "1", 0, 10),
        _run(4, "127.0.0.4", "0", 2, 3),
        _run(5, "127.0.0.3", "0,1", 9.5, 11),
        _run(6, "127.0.0.3", "1", 3, None),
    ]  # still open: left out
    sweep_run = SimpleNamespace(
        data=SimpleNamespace(tags={N.ROLE: N.ROLE_SWEEP}), info=SimpleNamespace(start_time=0, end_time=20)
    )
    assert trials_at_once_per_gpu([*runs, sweep_run]) == {
        "127.0.0.3 GPU 0": 2,
        "127.0.0.3 GPU 1": 2,
        "127.0.0.4 GPU 0": 1,
    }


# -- the rehearsal on a real local cluster, slow -------------------------------------------------

# Eight trials of 1 CPU and a quarter GPU at once: all the worker's 2 logical GPUs hold.
SWEEP = [
    "data.input_len=16",
    "model.latent_len=8",
    "trials.total=8",
    "max_concurrent=8",
    "resources.cpu=1",
    "resources.gpu=0.25",
    "retries=0",
]
# Trials of 1,000 epochs: none ends before the eighth has started, on any machine; the packing
# test then ends them all at their epoch with `seqae sweep stop --now`.
PACKED = ["train.epochs=1000", "train.patience=1000"]


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    """A head (no CPUs for trials) and one worker raylet with `--gpus-per-worker 2` (`ray start
    --num-gpus=2`: two logical GPUs, this machine has none) and `--cpus-per-worker 8`: eight logical
    CPUs on this 2-core machine, so that CPUs are not what limits the trials at once to eight.
    Started without SEQAE_LOGICAL_GPUS: each test's sweep opts in, or not, through its job."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the rehearsal is for machines without one")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(LOGICAL_GPUS, raising=False)
        yield from local_cluster(
            tmp_path_factory.mktemp("gpu-cluster"), workers=1, cpus_per_worker=8, gpus_per_worker=2
        )


def _submit(cluster, name: str, *extra: str, opt_in: bool = True) -> None:
    submit(cluster, name, *SWEEP, *extra, env={LOGICAL_GPUS: "1"} if opt_in else None)


def _trial_runs(cluster, name: str) -> dict[int, Any]:
    runs = mlflow_runs(None, name, tracking_uri=cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"])
    return {int(r.data.tags[N.TRIAL]): r for r in runs if N.TRIAL in r.data.tags}


def _logs(cluster, name: str) -> str:
    return seqae("sweep", "logs", name, "--workspace", cluster["env"]["SEQAE_WORKSPACE"], env=cluster["env"]).stdout


def _stopped_once_all_an_epoch_in(cluster, name: str, trials: int) -> dict[str, Any]:
    """Wait until each of the sweep's ``trials`` trials of 1,000 epochs is an epoch in, end them
    all at their epoch with `seqae sweep stop --now`, and return the ended job's info."""
    storage = Path(cluster["env"]["SEQAE_STORAGE"]) / name
    wait_for(
        lambda: len([m for m in trial_metas(storage).values() if m["epoch"] >= 1]) == trials,
        600,
        f"all {trials} trials an epoch in",
    )
    stopped = seqae(
        "sweep", "stop", name, "--now", "--workspace", cluster["env"]["SEQAE_WORKSPACE"], env=cluster["env"]
    )
    assert stopped.returncode == 0, stopped.stderr
    return wait_job(cluster, name)


def _cost_is_gpu_fraction_times_wall_time(cluster, name: str, info: dict) -> None:
    cost, runs = info["cost"], _trial_runs(cluster, name)
    assert cost["unit"] == "gpu-hours"
    metas = trial_metas(Path(cluster["env"]["SEQAE_STORAGE"]) / name)
    for number, meta in metas.items():
        seconds = 0.25 * sum(h["epoch_seconds"] for h in meta["history"])
        assert abs(cost["per_trial_seconds"][str(number)] - seconds) < 0.01
        assert runs[number].data.tags[N.RESOURCE] == "gpu"
        assert abs(runs[number].data.metrics["resource_seconds"] - seconds) < 0.01


@pytest.mark.slow
def test_without_the_opt_in_a_trial_on_a_logical_gpu_fails_naming_the_setting(gpu_cluster):
    name = "gpunoopt"
    _submit(gpu_cluster, name, "trials.total=1", "train.epochs=1", opt_in=False)
    info = wait_job(gpu_cluster, name)
    assert info["trials_by_state"] == {"FAIL": 1}, _logs(gpu_cluster, name)[-4000:]
    run = _trial_runs(gpu_cluster, name)[0]
    assert run.info.status == "FAILED"
    assert "torch finds no CUDA device on this node" in run.data.tags[N.ERROR]
    assert "SEQAE_LOGICAL_GPUS=1" in run.data.tags[N.ERROR]


@pytest.mark.slow
def test_four_trials_share_each_logical_gpu_and_record_it_and_their_gpu_hours(gpu_cluster):
    name = "gpupack"
    _submit(gpu_cluster, name, *PACKED)
    info = _stopped_once_all_an_epoch_in(gpu_cluster, name, 8)
    logs = _logs(gpu_cluster, name)
    assert info["job"]["status"] == "SUCCEEDED" and info["outcome"] == "stopped", logs[-4000:]
    assert info["trials_by_state"] == {"RUNNING": 8}, logs[-4000:]  # each stopped at its epoch, to continue
    assert "SEQAE_LOGICAL_GPUS=1: a trial that Ray gives a GPU on a node without CUDA trains on the CPU" in logs
    # the trials' own line (Ray folds the same line of other workers into "[repeated Nx ...]")
    assert "a logical GPU: this node has no CUDA device, so it trains on the CPU instead" in logs
    runs = _trial_runs(gpu_cluster, name)
    assert len(runs) == 8
    for run in runs.values():
        tags = run.data.tags
        assert tags[N.GPU] == "logical" and tags["ray.node_ip"] == "127.0.0.3"
        assert tags[N.GPU_IDS] in ("0", "1")  # one of the worker's two logical GPUs
        assert tags[N.CUDA_VISIBLE_DEVICES] == tags[N.GPU_IDS]  # the device Ray assigned is the one the trial sees
    at_once_per_gpu = trials_at_once_per_gpu(runs.values())
    assert set(at_once_per_gpu) == {"127.0.0.3 GPU 0", "127.0.0.3 GPU 1"}, at_once_per_gpu
    assert all(n <= 4 for n in at_once_per_gpu.values()), at_once_per_gpu  # a quarter GPU each: four fill one
    assert max(at_once_per_gpu.values()) == 4, at_once_per_gpu
    _cost_is_gpu_fraction_times_wall_time(gpu_cluster, name, info)


@pytest.mark.slow
def test_a_gpu_hours_budget_stops_a_sweep_on_logical_gpus(gpu_cluster):
    """1e-9 GPU-hours (3.6 microseconds) is spent by the first epoch of the first trial on any
    machine: every trial that started stops at its first epoch, and no trial starts once a first
    epoch has been paid for. At most eight quarter-GPU trials fit the two logical GPUs at once, so
    at least four of the twelve never start."""
    name = "gpubudget"
    _submit(gpu_cluster, name, "budget.gpu_hours=1e-9", "trials.total=12")
    info = wait_job(gpu_cluster, name)
    logs = _logs(gpu_cluster, name)
    assert info["job"]["status"] == "SUCCEEDED" and info["outcome"] == "stopped", logs[-4000:]
    assert "the budget of 1e-09 gpu-hours is spent" in info["control"]["drain"]
    states = info["trials_by_state"]
    # each trial that started was stopped by the budget, none by a rung: complete, with its one epoch
    assert states.get("PRUNED", 0) == 0 and states.get("NOT_STARTED", 0) >= 4, states
    assert info["cost"]["budget"] == 1e-9 and info["cost"]["hours"] >= 1e-9
    metas = trial_metas(Path(gpu_cluster["env"]["SEQAE_STORAGE"]) / name)
    assert metas and {meta["epoch"] for meta in metas.values()} == {1}, metas
    assert {r.data.tags[N.GPU] for r in _trial_runs(gpu_cluster, name).values()} == {"logical"}
    _cost_is_gpu_fraction_times_wall_time(gpu_cluster, name, info)


# -- the same packing on a real GPU (the marker gpu: skipped where torch sees none) ---------------


@pytest.fixture(scope="module")
def real_gpu_cluster(tmp_path_factory):
    """A head and one worker raylet with the GPUs Ray detects: this machine's real ones."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(LOGICAL_GPUS, raising=False)
        yield from local_cluster(tmp_path_factory.mktemp("real-gpu-cluster"), workers=1, cpus_per_worker=4)


@pytest.mark.slow
@pytest.mark.gpu
def test_two_half_gpu_trials_train_on_the_real_gpu_at_once(real_gpu_cluster):
    """The rehearsal's twin on a GPU: two 0.5-GPU trials of 1,000 epochs both train on CUDA, on the
    one GPU at the same time, until `seqae sweep stop --now` ends them at their epoch."""
    name = "realgpu"
    submit(
        real_gpu_cluster,
        name,
        "data.input_len=16",
        "model.latent_len=8",
        "trials.total=2",
        "max_concurrent=2",
        "resources.cpu=1",
        "resources.gpu=0.5",
        "retries=0",
        *PACKED,
    )
    info = _stopped_once_all_an_epoch_in(real_gpu_cluster, name, 2)
    assert info["trials_by_state"] == {"RUNNING": 2}, _logs(real_gpu_cluster, name)[-4000:]
    runs = _trial_runs(real_gpu_cluster, name)
    assert len(runs) == 2 and all(run.data.tags[N.GPU] == "cuda" for run in runs.values())
    assert list(trials_at_once_per_gpu(runs.values()).values()) == [2]  # one GPU, both trials on it at once
