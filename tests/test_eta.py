"""sweeps/results/eta.py and sweeps/results/plan.py: a sweep's expected epochs under its scheduler
(checked against the service's own ASHA and Hyperband, fed results), its wall time at a number of
slots, the ETA a running sweep's own records give (real Optuna study and checkpoint records, no
Ray), and `seqae sweep plan` on real data, with its refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from seqae_cli.main import main
from seqae_core import metrics as M
from sweeps.results.eta import Eta, asha_epochs, eta, expected_epochs, wall_seconds
from sweeps.results.plan import shapes_of
from sweeps.running.schedulers import ResumableASHA, stub_trial
from sweeps.spec import sweep as spec_lib
from sweeps.spec.trial import TrialSpec
from sweeps.stores.workspace import Workspace
from tests.refusal import assert_refused
from tests.test_status import QUICKSTART, quickstart, run_trials, start_sweep, template, workspace, write_sweep  # noqa: F401
from tests.sweep_helpers import TINY


@pytest.mark.parametrize("max_t, grace, factor, done, expected", [
    pytest.param(3, 1, 2, 0, 1 + 1 / 2 + 1 / 4, id="quickstart"),
    pytest.param(3, 1, 2, 1, 1 + 1 / 2, id="past-the-first-rung"),
    pytest.param(3, 1, 2, 2, 1, id="past-every-rung"),
    pytest.param(20, 1, 3, 0, 1 + 2 / 3 + 6 / 9 + 11 / 27, id="rungs-1-3-9"),
    pytest.param(4, 0.25, 4, 0, 0.25 + 0.75 / 4 + 3 / 16, id="sub-epoch-rungs"),
    pytest.param(2, 1, 2, 0.5, 0.5 + 1 / 2, id="between-rungs"),
])
def test_asha_epochs_sums_each_rungs_share(max_t, grace, factor, done, expected):
    assert asha_epochs(max_t, grace, factor, done) == pytest.approx(expected)


@pytest.mark.parametrize("scheduler", ["asha", "hyperband"])
def test_expected_epochs_match_the_services_own_scheduler_fed_random_results(scheduler):
    """2,000 trials, one after another, through ``ResumableASHA`` as the sweep builds it, each
    result an independent random value (so each rung's cutoff passes its 1/factor share, the
    arithmetic's premise): the mean epochs they train come within 3% of the arithmetic."""
    spec = spec_lib.load(QUICKSTART, ["train.epochs=9", f"scheduler.type={scheduler}", "scheduler.reduction_factor=2"])
    max_t = 9
    asha = ResumableASHA({}, spec.objectives, time_attr=M.EPOCH, metric=M.VAL_TOKEN_ACCURACY, mode="max", max_t=max_t,
                         grace_period=1, reduction_factor=2, brackets=spec.scheduler.brackets(max_t))
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
    grid = spec_lib.load(QUICKSTART, ["start={}", "model.latent_len=8", "grid.data.input_len=[16,32]", "search.model.d_attn={type: int, low: 16, high: 64}"])
    assert shapes_of(grid) == [{"data.input_len": n, "model.d_model": d, "model.d_attn": 40}
                               for n in (16, 32) for d in (64, 128)]


def test_a_running_sweeps_eta_comes_from_its_own_epochs(workspace, capsys):
    """Five trials, two at once: the starting point trained its 3 epochs, a trial was pruned after
    1, one runs past its first epoch; each epoch took 10 s."""
    state = write_sweep(workspace, "going", quickstart(), [{"outcome": "running"}])
    assert eta(state).line() == "ETA: after the first epoch ends (5 trials left)"
    run_trials(start_sweep(workspace, state), state.backends.storage,
               [([10.0] * 3, 0.9, True), ([10.0], 0.5, False), ([10.0], 0.7, None)])
    left = 1.5 + 2 * 1.75  # the running trial's rungs from epoch 1, and two trials to come
    found = eta(state)
    assert found == Eta(seconds_per_epoch=10.0, overhead_per_trial=0.0, epochs_done=5.0, epochs_left=pytest.approx(left),
                        trials_left=3, running=1, slots=2, seconds_left=pytest.approx(left * 10 / 2))
    assert main(["sweep", "status", "going", "--workspace", str(workspace.root)]) == 0
    assert "  ETA: 25s left: 3 trials (1 running), 5.0 epochs expected at 10.0 s each, 2 at once" in capsys.readouterr().out


def test_plan_forecasts_from_the_steps_it_measures(tmp_path, capsys):
    workspace = tmp_path / "ws"
    args = ["sweep", "plan", str(QUICKSTART), *[a for s in TINY for a in ("--set", s)], "--set", "scheduler.type=asha",
            "--set", "max_concurrent=2", "--set", "trials.total=5", "--workspace", str(workspace)]
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
    assert (workspace / "cache").is_dir()  # the sweep's data, prepared where its run will find it

    assert main(args) == 0
    out = capsys.readouterr().out
    assert "trials: 5 (1 starting point, trained to the end)" in out
    assert "epochs: ASHA, 1.50 expected per proposed trial of at most 2; 8.0 in all" in out
    assert "wall time at 2 slots (max_concurrent 2, " in out


@pytest.mark.parametrize("extra, says", [
    pytest.param(["--set", "scheduler.reduction_factr=2"], "reduction_factr", id="unknown-key"),
    pytest.param(["--set", "scheduler.reduction_factor=1"], "reduction_factor", id="bad-value"),
    pytest.param(["--slots", "0"], "--slots 0", id="no-slots"),
    pytest.param(["--set", "resources.gpu=0.5"], "resources.gpu=0.5: this machine has no GPU", id="gpu-trials-here",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="refused only where there is no GPU")),
])
def test_plan_refuses_bad_input_in_one_line_before_preparing_data(tmp_path, capsys, extra, says):
    workspace = tmp_path / "ws"
    code = main(["sweep", "plan", str(QUICKSTART), *[a for s in TINY for a in ("--set", s)], *extra,
                 "--workspace", str(workspace)])
    assert_refused(code, capsys.readouterr().err, says, created=(Workspace(workspace).cache_dir,))
