"""sweeps/results/eta.py and sweeps/results/plan.py: a sweep's expected epochs under its scheduler
(checked against the service's own ASHA and Hyperband, fed results), its wall time at a number of
slots, the ETA a running sweep's own records give (real Optuna study and checkpoint records, no
Ray), and `seqae sweep plan` on real data, with its refusals."""

from __future__ import annotations

import json
import os
import socket
import time

import numpy as np
import pytest
import torch

from seqae.cli.main import main
from seqae_core import metrics as M
from sweeps.results import eta as eta_lib
from sweeps.results.eta import Eta, asha_epochs, eta, expected_epochs, granted, seconds_left, wall_seconds
from sweeps.results.plan import queue_slots, shapes_of
from sweeps.running.schedulers import ResumableASHA, stub_trial
from sweeps.spec import sweep as spec_lib
from sweeps.spec.trial import TrialSpec
from sweeps.stores.ownership import USER
from sweeps.stores.queue import Entry, Queue
from sweeps.stores.shares import FAIR, PRIORITY, Share
from sweeps.stores.workspace import SessionRecord, Workspace
from tests.refusal import assert_refused
from tests.sweep_helpers import TINY
from tests.test_status import QUICKSTART, quickstart, run_trials, start_sweep, template, workspace, write_sweep  # noqa: F401


@pytest.mark.parametrize(
    "max_t, grace, factor, done, expected",
    [
        pytest.param(3, 1, 2, 0, 1 + 1 / 2 + 1 / 4, id="quickstart"),
        pytest.param(3, 1, 2, 1, 1 + 1 / 2, id="past-the-first-rung"),
        pytest.param(3, 1, 2, 2, 1, id="past-every-rung"),
        pytest.param(20, 1, 3, 0, 1 + 2 / 3 + 6 / 9 + 11 / 27, id="rungs-1-3-9"),
        pytest.param(4, 0.25, 4, 0, 0.25 + 0.75 / 4 + 3 / 16, id="sub-epoch-rungs"),
        pytest.param(2, 1, 2, 0.5, 0.5 + 1 / 2, id="between-rungs"),
    ],
)
def test_asha_epochs_sums_each_rungs_share(max_t, grace, factor, done, expected):
    assert asha_epochs(max_t, grace, factor, done) == pytest.approx(expected)


@pytest.mark.parametrize("scheduler", ["asha", "hyperband"])
def test_expected_epochs_match_the_services_own_scheduler_fed_random_results(scheduler):
    """2,000 trials, one after another, through ``ResumableASHA`` as the sweep builds it, each
    result an independent random value (so each rung's cutoff passes its 1/factor share, the
    arithmetic's premise): the mean epochs they train come within 3% of the arithmetic."""
    spec = spec_lib.load(QUICKSTART, ["train.epochs=9", f"scheduler.type={scheduler}", "scheduler.reduction_factor=2"])
    max_t = 9
    asha = ResumableASHA(
        {},
        spec.objectives,
        time_attr=M.EPOCH,
        metric=M.VAL_TOKEN_ACCURACY,
        mode="max",
        max_t=max_t,
        grace_period=1,
        reduction_factor=2,
        brackets=spec.scheduler.brackets(max_t),
    )
    rng = np.random.default_rng(0)
    trained = []
    for number in range(2000):
        view = stub_trial(TrialSpec(number, {}, None))
        asha.on_trial_add(None, view)
        for epoch in range(1, max_t + 1):
            decision = asha.on_trial_result(None, view, {M.EPOCH: epoch, M.VAL_TOKEN_ACCURACY: rng.random()})
            if decision == ResumableASHA.STOP or epoch == max_t:
                trained.append(epoch)
                break
    assert np.mean(trained) == pytest.approx(expected_epochs(spec.scheduler, max_t), rel=0.03)


def test_expected_epochs_without_a_scheduler_and_for_a_starting_point():
    spec = spec_lib.load(QUICKSTART)
    assert expected_epochs(spec_lib.load(QUICKSTART, ["scheduler.type=none"]).scheduler, 3, done=1) == 2
    assert expected_epochs(spec.scheduler, 3, done=1, start=True) == 2


def test_wall_time_shares_the_trials_evenly_but_never_beats_the_longest():
    assert wall_seconds([10, 10, 10, 10], 2) == 20
    assert wall_seconds([30, 1, 1], 3) == 30
    assert wall_seconds([], 2) == 0


def test_the_shapes_timed_are_the_searched_non_free_keys_choices():
    spec = spec_lib.load(QUICKSTART)  # lr is free: not timed; two widths of two values each (int, step 64)
    assert shapes_of(spec) == [{"model.d_model": d, "model.d_attn": a} for d in (64, 128) for a in (64, 128)]
    grid = spec_lib.load(
        QUICKSTART,
        [
            "start={}",
            "model.latent_len=8",
            "grid.data.input_len=[16,32]",
            "search.model.d_attn={type: int, low: 16, high: 64}",
        ],
    )
    assert shapes_of(grid) == [
        {"data.input_len": n, "model.d_model": d, "model.d_attn": 40} for n in (16, 32) for d in (64, 128)
    ]


# (F811: `workspace` is the fixture imported from tests/test_status.py, which pytest passes by that name)
def test_a_running_sweeps_eta_comes_from_its_own_epochs_at_the_queues_share(workspace, capsys, monkeypatch):  # noqa: F811
    """Five trials, two at once: the starting point trained its 3 epochs, a trial was pruned after
    1, one runs past its first epoch; each epoch took 10 s."""
    state = write_sweep(workspace, "going", quickstart(), [SessionRecord(0.0, 1, None, "h", "running")])
    assert eta(state).line() == "ETA: after the first epoch ends (5 trials left)"
    run_trials(
        start_sweep(workspace, state),
        state.backends.storage,
        [([10.0] * 3, 0.9, True), ([10.0], 0.5, False), ([10.0], 0.7, None)],
    )
    left = 1.5 + 2 * 1.75  # the running trial's rungs from epoch 1, and two trials to come
    found = eta(state)
    assert found == Eta(
        seconds_per_epoch=10.0,
        overhead_per_trial=0.0,
        epochs_done=5.0,
        epochs_left=pytest.approx(left),
        trials_left=3,
        running=1,
        slots=2,
        seconds_left=pytest.approx(left * 10 / 2),
        slots_from="max_concurrent",
    )
    assert main(["sweep", "status", "going", "--workspace", str(workspace.root)]) == 0
    assert (
        "  ETA: 25s left: 3 trials (1 running), 5.0 epochs expected at 10.0 s each, 2 at once (max_concurrent)"
        in capsys.readouterr().out
    )

    # its driver in the cluster's queue beside another sweep of its priority: its fair share is 1 slot
    queue = Queue(state.backends.optuna_storage)
    now = time.time()
    here = dict(host=socket.gethostname(), pid=os.getpid())
    queue.join(Entry("going", "ann", 0, 2, 2, 1.0, 0.0, 1, 0, 0, 2, 5, now, now, None, 2.0, 0.0, **here))
    queue.join(Entry("other", "bob", 0, 2, 2, 1.0, 0.0, 1, 0, 0, 0, 4, now - 10, now, None, 2.0, 0.0, **here))
    shared = eta(state)
    assert (shared.slots, shared.slots_from, shared.seconds_left) == (
        1,
        "the queue's share: fair share",
        pytest.approx(left * 10),
    )
    assert "2 at once" not in shared.line() and "1 at once (the queue's share: fair share)" in shared.line()
    monkeypatch.setenv(USER, "bob")
    queue.set_priority("other", 1)  # the other sweep takes both slots: this one waits
    waiting = eta(state)
    assert (waiting.slots, waiting.seconds_left) == (0, None)
    assert waiting.line() == (
        "ETA: none while the cluster's queue gives it no slot (3 trials left, the queue's share: higher priority)"
    )

    # its driver writes the same ETA into the queue, where `seqae cluster queue` shows it
    queue.leave("other", "complete", 4)
    monkeypatch.setattr(eta_lib, "PUBLISH_SECONDS", 0.05)
    with eta_lib.publishing(workspace, "going"):
        while queue.entry("going").eta_end is None:
            time.sleep(0.05)
    expected = eta(state).seconds_left
    assert queue.entry("going").eta_end - time.time() == pytest.approx(expected, abs=5)
    monkeypatch.delenv("SEQAE_OPTUNA_STORAGE", raising=False)
    assert main(["cluster", "queue", "--workspace", str(workspace.root)]) == 0
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("going "))
    assert row[-1] in {M.duration_text(expected - s) for s in range(6)}  # counted down since it was written


@pytest.mark.parametrize(
    "share, ceiling, left, expected",
    [
        pytest.param(None, 4, 10, (4, "max_concurrent"), id="not-in-the-queue"),
        pytest.param(None, 4, 0, (1, "max_concurrent"), id="not-in-the-queue-nothing-left"),
        pytest.param(Share(2, FAIR), 4, 10, (2, "the queue's share: fair share"), id="fair-share"),
        pytest.param(Share(4), 2, 10, (2, "the queue's share"), id="capped-by-its-ceiling"),
        pytest.param(Share(2, FAIR), 4, 1, (1, "the queue's share"), id="fewer-trials-left"),
        pytest.param(Share(0, PRIORITY), 4, 3, (0, "the queue's share: higher priority"), id="waits"),
    ],
)
def test_the_eta_runs_at_the_queues_share_capped_by_its_ceiling(share, ceiling, left, expected):
    assert granted(share, ceiling, left) == expected


def test_time_left_shares_the_work_among_the_slots_never_below_the_longest_trial():
    assert seconds_left(120.0, 10.0, 1) == 120.0
    assert seconds_left(120.0, 10.0, 3) == 40.0  # 3 slots of a share, not 4 of max_concurrent: 30
    assert seconds_left(120.0, 50.0, 3) == 50.0
    assert seconds_left(120.0, 10.0, 0) is None  # no slot: it waits for the queue


def test_plan_forecasts_from_the_steps_it_measures(tmp_path, capsys):
    folder = tmp_path / "ws"
    args = [
        "sweep",
        "plan",
        str(QUICKSTART),
        *[a for s in TINY for a in ("--set", s)],
        "--set",
        "scheduler.type=asha",
        "--set",
        "max_concurrent=2",
        "--set",
        "trials.total=5",
        "--workspace",
        str(folder),
    ]
    assert main([*args, "--slots", "1", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert (one["trials"], one["starts"], one["max_epochs"], one["slots"]) == (5, 1, 2, 1)
    assert one["epochs_per_trial"] == pytest.approx(1.5)  # rung at 1, half go on to 2
    assert one["epochs"] == pytest.approx(2 + 4 * 1.5)
    (shape,) = one["shapes"]  # TINY pins the widths: one shape
    assert shape["step_seconds"] > 0 and shape["epoch_seconds"] > shape["step_seconds"]
    assert one["wall_seconds"] == pytest.approx(2 * shape["epoch_seconds"] + 4 * 1.5 * shape["epoch_seconds"])
    assert one["resource_hours"] == pytest.approx(one["wall_seconds"] / 3600)
    assert one["mlflow_runs"] == 6 and one["optuna_intermediate_rows"] == 8
    assert one["checkpoint_bytes"] == 5 * shape["checkpoint_bytes"]
    assert (folder / "cache").is_dir()  # the sweep's data, prepared where its run will find it

    assert main(args) == 0
    out = capsys.readouterr().out
    assert "trials: 5 (1 starting point, trained to the end)" in out
    assert "epochs: ASHA, 1.50 expected per proposed trial of at most 2; 8.0 in all" in out
    assert "wall time at 2 slots (max_concurrent 2, " in out


@pytest.mark.parametrize(
    "extra, says",
    [
        pytest.param(["--set", "scheduler.reduction_factr=2"], "reduction_factr", id="unknown-key"),
        pytest.param(["--set", "scheduler.reduction_factor=1"], "reduction_factor", id="bad-value"),
        pytest.param(["--slots", "0"], "--slots 0", id="no-slots"),
        pytest.param(
            ["--set", "resources.gpu=0.5"],
            "resources.gpu=0.5: this machine has no GPU",
            id="gpu-trials-here",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="refused only where there is no GPU"),
        ),
    ],
)
def test_plan_refuses_bad_input_in_one_line_before_preparing_data(tmp_path, capsys, extra, says):
    folder = tmp_path / "ws"
    code = main(
        ["sweep", "plan", str(QUICKSTART), *[a for s in TINY for a in ("--set", s)], *extra, "--workspace", str(folder)]
    )
    assert_refused(code, capsys.readouterr().err, says, created=(Workspace(folder).cache_dir,))


def test_plan_times_the_sweep_at_the_share_the_queue_would_give_it_now(tmp_path, monkeypatch, capsys):
    """A sweep of max_concurrent 4 planned beside a running sweep of its priority on a 4-CPU
    cluster: the queue would give it 2 slots; at a higher priority, or a weight of 3, more; with
    no sweep ever run on the database, or --slots, what this machine holds or what it says."""
    folder = tmp_path / "ws"
    folder.mkdir()
    monkeypatch.delenv("SEQAE_OPTUNA_STORAGE", raising=False)
    url = f"sqlite:///{folder / 'optuna.db'}"
    spec = spec_lib.load(QUICKSTART, [*TINY, "max_concurrent=4", "trials.total=8"])
    assert queue_slots(spec, url) is None  # no queue here yet
    now = time.time()
    Queue(url).join(
        Entry(
            "running",
            "ann",
            0,
            4,
            4,
            1.0,
            0.0,
            4,
            0,
            0,
            0,
            8,
            now,
            now,
            None,
            4.0,
            0.0,
            socket.gethostname(),
            os.getpid(),
        )
    )
    assert queue_slots(spec, url) == (2, "the cluster's queue now: 2 of 4 CPUs at priority 0, fair share")
    assert queue_slots(spec.model_copy(update={"priority": 1}), url) == (
        4,
        "the cluster's queue now: 4 of 4 CPUs at priority 1",
    )
    assert queue_slots(spec.model_copy(update={"weight": 3.0}), url)[0] == 3

    args = [
        "sweep",
        "plan",
        str(QUICKSTART),
        *[a for s in TINY for a in ("--set", s)],
        "--set",
        "max_concurrent=4",
        "--set",
        "trials.total=8",
        "--workspace",
        str(folder),
    ]
    assert main(args) == 0
    assert (
        "wall time at 2 slots (max_concurrent 4, the cluster's queue now: 2 of 4 CPUs at priority 0, fair share)"
        in capsys.readouterr().out
    )
    assert main([*args, "--slots", "3"]) == 0
    assert "wall time at 3 slots (max_concurrent 4, --slots 3)" in capsys.readouterr().out
