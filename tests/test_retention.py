"""A sweep's disk does not grow with every trial (sweeps/stores/retention.py, RecordStore.release): an
ended trial outside the ``checkpoints.keep_best`` best keeps its progress, samples and metrics and
loses its model and optimizer state; the kept and the running keep everything; a trial whose worker
still holds its records is released later; `extend --epochs` of a released trial is refused in
one line. A real Optuna study (SQLite in ``tmp_path``), real records and a real workspace; no Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seqae_core import metrics as M
from seqae_core.checkpoint import CheckpointStore, tensor_bytes
from seqae_core.records import METRICS, MODEL, SAMPLES_JSON, SAMPLES_TXT, STATE, RecordStore, TrialProgress
from seqae_errors import ConfigError
from sweeps.running import lifecycle
from sweeps.stores.retention import Retention
from tests.test_status import quickstart, run_trials, start_sweep, template, workspace, write_sweep  # noqa: F401

MB = 10**6


def train_records(storage: str, number: int, epochs: int, accuracy: float, weights: int = MB) -> CheckpointStore:
    """Trial ``number``'s records as a training leaves them: an epoch record per epoch (the store
    keeps two) with about ``3 * weights`` bytes of state, and a best-model record of ``weights``."""
    store = CheckpointStore.of_trial(storage, number)
    history = [{M.EPOCH: e, M.VAL_TOKEN_ACCURACY: accuracy, M.EPOCH_SECONDS: 1.0} for e in range(1, epochs + 1)]
    for epoch in range(1, epochs + 1):
        store.save_epoch(
            epoch,
            {"epoch": epoch, "state": torch.zeros(3 * weights // 4)},
            {"history": history[:epoch], "finished": epoch == epochs, "patience_spent": False},
        )
        store.save_best(
            epoch,
            {
                MODEL: tensor_bytes({"model": torch.zeros(weights // 4)}),
                SAMPLES_JSON: b"[]",
                SAMPLES_TXT: b"original: a",
                METRICS: json.dumps(history[epoch - 1]).encode(),
            },
            {"metrics": history[epoch - 1], "config": {"train.lr": 0.001}},
        )
    return store


def disk(store: RecordStore) -> int:
    return sum(f.stat().st_size for f in Path(store.root).rglob("*") if f.is_file())


def test_a_released_run_keeps_its_progress_samples_and_metrics_and_frees_its_model_and_state(tmp_path):
    store = train_records(str(tmp_path), 0, epochs=3, accuracy=0.7)
    before, progress = disk(store), store.progress()
    assert len(store.records("epoch")) == 2 and before > 4 * MB

    freed = store.release()

    assert disk(store) < 0.01 * MB and freed == pytest.approx(before, rel=0.01)
    assert store.progress() == TrialProgress(progress.epoch, progress.history, True, False, released=True)
    assert [r.rsplit("/", 1)[1] for r in store.records("epoch")] == ["epoch-000003"]
    best = store.latest("best")
    assert best.epoch == 3 and set(best.files) == {SAMPLES_JSON, SAMPLES_TXT, METRICS}
    assert best.meta["config"] == {"train.lr": 0.001} and best.skipped == []
    assert store.latest("epoch").skipped == [] and STATE not in store.latest("epoch").files
    assert store.release() == 0  # twice is once
    with pytest.raises(ConfigError, match="checkpoints were released .* it cannot train on"):
        store.resume()


def test_release_keeps_the_newest_record_a_crash_left_valid_never_an_incomplete_one(tmp_path):
    store = train_records(str(tmp_path), 0, epochs=2, accuracy=0.7)
    (Path(store.root) / "epoch-000003").mkdir()  # a write the crash cut before its manifest
    (Path(store.root) / "epoch-000003" / STATE).write_bytes(b"partial")

    store.release()

    assert [r.rsplit("/", 1)[1] for r in store.records("epoch")] == ["epoch-000002"]
    assert store.progress().epoch == 2 and store.progress().released


def test_ended_trials_outside_the_best_are_released_and_the_best_and_the_running_keep_theirs(workspace, tmp_path):  # noqa: F811
    state = write_sweep(workspace, "kept", quickstart("checkpoints.keep_best=2"))
    study, storage = start_sweep(workspace, state), str(tmp_path / "storage")
    retention = Retention(study, storage, 2, {})
    accuracies = [0.5, 0.9, 0.7]
    numbers = run_trials(study, storage, [([1.0, 1.0], a, True) for a in accuracies])
    for number, accuracy in zip(numbers, accuracies):
        train_records(storage, number, 2, accuracy)
        retention.settle(number)
    released = {n for n in numbers if RecordStore.of_trial(storage, n).progress().released}
    assert released == {numbers[0]}  # 0.5: outside the best two

    (running,) = run_trials(study, storage, [([1.0], 0.1, None)])
    train_records(storage, running, 1, 0.1)
    (better,) = run_trials(study, storage, [([1.0, 1.0], 0.95, True)])
    train_records(storage, better, 2, 0.95)
    retention.settle(better)  # pushes 0.7 out of the best two
    released = {n for n in (*numbers, running, better) if RecordStore.of_trial(storage, n).progress().released}
    assert released == {numbers[0], numbers[2]}
    assert (
        retention.summary()
        == (
            "checkpoints kept for the 2 best trials (checkpoints.keep_best=2); released for 2 "
            f"ended trials, {retention.freed / 1e6:.1f} MB freed"
        )
        and retention.freed > 8 * MB
    )


def test_a_trial_whose_worker_holds_its_records_is_released_once_it_lets_go(workspace, tmp_path):  # noqa: F811
    state = write_sweep(workspace, "held", quickstart("checkpoints.keep_best=1"))
    study, storage = start_sweep(workspace, state), str(tmp_path / "storage")
    first, second = run_trials(study, storage, [([1.0], 0.9, True), ([1.0], 0.5, True)])
    for number, accuracy in ((first, 0.9), (second, 0.5)):
        train_records(storage, number, 1, accuracy)
    retention = Retention(study, storage, 1, {})

    with RecordStore.of_trial(storage, second).exclusive():  # a stopped trial's worker, still ending
        retention.settle(second)
        assert not RecordStore.of_trial(storage, second).progress().released
    retention.settle()  # the session's end

    assert RecordStore.of_trial(storage, second).progress().released
    assert not RecordStore.of_trial(storage, first).progress().released


def test_a_new_session_releases_what_a_dead_driver_left(workspace, tmp_path):  # noqa: F811
    state = write_sweep(workspace, "dead", quickstart("checkpoints.keep_best=1"))
    study, storage = start_sweep(workspace, state), str(tmp_path / "storage")
    numbers = run_trials(study, storage, [([1.0], a, True) for a in (0.9, 0.5, 0.6)])
    for number, accuracy in zip(numbers, (0.9, 0.5, 0.6)):
        train_records(storage, number, 1, accuracy)

    retention = Retention(study, storage, 1, RecordStore.progress_of(storage, numbers))
    retention.settle()

    assert [RecordStore.of_trial(storage, n).progress().released for n in numbers] == [False, True, True]


def test_extending_a_released_trial_is_refused_in_one_line_and_reopens_nothing(workspace, tmp_path):  # noqa: F811
    state = write_sweep(workspace, "ext", quickstart("checkpoints.keep_best=2"))
    state.sets = [*state.sets, "checkpoints.keep_best=2"]  # as `seqae sweep run --set` records it
    workspace.write(state)
    study = start_sweep(workspace, state)
    storage = state.backends.storage
    accuracies = [0.9, 0.8, 0.7, 0.6, 0.5]
    numbers = run_trials(study, storage, [([1.0, 1.0], a, True) for a in accuracies])
    for number, accuracy in zip(numbers, accuracies):
        train_records(storage, number, 2, accuracy)
    Retention(study, storage, 2, RecordStore.progress_of(storage, numbers)).settle()

    with pytest.raises(ConfigError) as refused:
        lifecycle.extend_epochs(workspace, "ext", 4, "best:3")
    message = str(refused.value)
    assert "\n" not in message and f"trials {numbers[2]} cannot train on" in message
    assert "checkpoints.keep_best=2" in message and "best:2" in message
    assert study.continuing() == {}

    notes = lifecycle.extend_epochs(workspace, "ext", 4, "best:2")
    assert notes == [f"trial {n}: trains on from epoch 2 to 4" for n in numbers[:2]]
