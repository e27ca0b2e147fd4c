"""The sweep's ASHA (sweeps.runner.ResumableASHA) on its own: Ray's scheduler, fed results as Tune
feeds them, without a cluster or training."""

from __future__ import annotations

from types import SimpleNamespace

from ray.tune.schedulers import TrialScheduler

from seqae_core import metrics as M
from sweeps.runner import ResumableASHA
from sweeps.search import TrialSpec


def _trial(number: int, start: str | None = None) -> SimpleNamespace:
    """What the scheduler reads of a Tune trial: its id and the TrialSpec in its config."""
    return SimpleNamespace(trial_id=f"t{number}", config={"trial": TrialSpec(number, {}, None, start=start)})


def test_a_starting_point_is_never_stopped_but_counts_at_every_rung():
    asha = ResumableASHA({}, 1.0, time_attr=M.EPOCH, metric=M.VAL_TOKEN_ACCURACY, mode="max", max_t=9,
                         grace_period=1, reduction_factor=3)
    good = [_trial(n) for n in range(3)]
    start, weak = _trial(3, "paper"), _trial(4)
    for trial in [*good, start, weak]:
        asha.on_trial_add(None, trial)
    for trial in good:  # three good trials reach the first rung first
        assert asha.on_trial_result(None, trial, {M.EPOCH: 1, M.VAL_TOKEN_ACCURACY: 0.9}) == TrialScheduler.CONTINUE

    # Below the rung's cutoff, a proposed trial stops, a starting point goes on to its last epoch.
    assert asha.on_trial_result(None, weak, {M.EPOCH: 1, M.VAL_TOKEN_ACCURACY: 0.1}) == TrialScheduler.STOP
    for epoch in (1, 3):
        assert asha.on_trial_result(None, start, {M.EPOCH: epoch, M.VAL_TOKEN_ACCURACY: 0.1}) == TrialScheduler.CONTINUE
    assert asha.on_trial_result(None, start, {M.EPOCH: 9, M.VAL_TOKEN_ACCURACY: 0.1}) == TrialScheduler.STOP  # the end
    assert "t3" in dict(asha.bracket._rungs)[1]  # its value counts at the rung like any trial's
    assert not asha.stops(3, start=True)
