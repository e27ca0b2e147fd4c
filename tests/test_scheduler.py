"""The sweep's ASHA (sweeps.running.schedulers.ResumableASHA) on its own: Ray's scheduler, fed results as Tune
feeds them, without a cluster or training."""

from __future__ import annotations

from types import SimpleNamespace

from ray.tune.schedulers import TrialScheduler

from seqae_core import metrics as M
from sweeps.running import ray_private as RP
from sweeps.running.schedulers import ParetoASHA, ResumableASHA
from sweeps.spec.sections import Objective
from sweeps.spec.trial import TrialSpec


def _trial(number: int, start: str | None = None) -> SimpleNamespace:
    """What the scheduler reads of a Tune trial: its id and the TrialSpec in its config."""
    return SimpleNamespace(trial_id=f"t{number}", config={"trial": TrialSpec(number, {}, None, start=start)})


def test_a_starting_point_is_never_stopped_but_counts_at_every_rung():
    asha = ResumableASHA(
        {},
        (Objective(metric=M.VAL_TOKEN_ACCURACY, mode="max"),),
        time_attr=M.EPOCH,
        metric=M.VAL_TOKEN_ACCURACY,
        mode="max",
        max_t=9,
        grace_period=1,
        reduction_factor=3,
    )
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
    assert "t3" in dict(RP.rungs(asha.bracket_of(3)))[1]  # its value counts at the rung like any trial's
    assert not asha.stops(3, start=True)


def test_rung_agreement_ranks_the_trials_at_each_epoch_against_their_final_objective():
    """`python -m research.rung_agreement`' arithmetic: Kendall's tau of each epoch's values against each trial's
    best, and what deciding there on the top third would have lost."""
    from research.rung_agreement import agreement

    # trial 0 starts worst and ends best; trial 2 leads at epoch 1 and never improves
    rows = agreement({0: [0.1, 0.5, 0.9], 1: [0.2, 0.4, 0.6], 2: [0.3, 0.3, 0.3]})
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert [r["kendall_tau"] for r in rows] == [-1.0, 1.0, 1.0]
    assert [r["best_in_top_1/3"] for r in rows] == [False, True, True]
    assert [r["regret_of_leader"] for r in rows] == [0.6, 0.0, 0.0]


def test_several_objectives_rank_a_rung_by_non_dominated_sorting_and_resume_the_same():
    """Accuracy up, latent share down, factor 2. Three trials reach the first rung; a fourth with the
    lowest accuracy but the smallest latent is on the rung's front and goes on; a fifth that the
    others beat on both stops. Rebuilt from the trials' records, a rung judges each trial against all
    it holds (which reached it first is not recorded, as with one objective): the fifth and the third
    are behind again, the second, behind the first alone when it arrived, is now inside the best half."""
    objectives = (Objective(metric=M.VAL_TOKEN_ACCURACY, mode="max"), Objective(metric=M.LATENT_SHARE, mode="min"))
    settings = {
        "time_attr": M.EPOCH,
        "max_t": 4,
        "grace_period": 1,
        "reduction_factor": 2,
        "metric": M.VAL_TOKEN_ACCURACY,
        "mode": "max",
    }  # Tune sets the first objective so
    asha = ParetoASHA({}, objectives, **settings)
    points = [(0.9, 0.5), (0.8, 0.5), (0.7, 0.5), (0.3, 0.125), (0.6, 0.5)]
    decisions, history = [], {}
    for number, (accuracy, share) in enumerate(points):
        trial = _trial(number)
        asha.on_trial_add(None, trial)
        record = {M.EPOCH: 1, M.VAL_TOKEN_ACCURACY: accuracy, M.LATENT_SHARE: share}
        decisions.append(asha.on_trial_result(None, trial, record))
        history[number] = [record]
    assert decisions == [
        TrialScheduler.CONTINUE,
        TrialScheduler.STOP,
        TrialScheduler.STOP,
        TrialScheduler.CONTINUE,
        TrialScheduler.STOP,
    ]
    end = {M.EPOCH: 4, M.VAL_TOKEN_ACCURACY: 0.95, M.LATENT_SHARE: 0.5}
    assert asha.on_trial_result(None, _trial(0), end) == TrialScheduler.STOP  # its last epoch
    rebuilt = ParetoASHA(history, objectives, **settings)
    assert [rebuilt.stops(n) for n in range(5)] == [False, False, True, False, True]


def test_rungs_below_an_epoch_decide_at_the_validation_that_reaches_them_and_resume_the_same():
    """train.validate_every=0.25 makes the epochs trained a fraction: rungs at 0.25, 0.5 and 1 of
    max_t 2 (grace_period 0.25, factor 2). Two trials reach a quarter of an epoch; a third, worse,
    stops there, mid-epoch. Rebuilt from the trials' records, each rung holds the first record at or
    past it, and the third is behind again."""
    objective = (Objective(metric=M.VAL_TOKEN_ACCURACY, mode="max"),)
    settings = {
        "time_attr": M.EPOCH,
        "metric": M.VAL_TOKEN_ACCURACY,
        "mode": "max",
        "max_t": 2,
        "grace_period": 0.25,
        "reduction_factor": 2,
    }
    asha = ResumableASHA({}, objective, **settings)
    assert [milestone for milestone, _ in RP.rungs(asha.bracket_of(0))] == [2, 1, 0.5, 0.25]
    trials = [_trial(n) for n in range(3)]
    for trial in trials:
        asha.on_trial_add(None, trial)
    history: dict[int, list[dict[str, float]]] = {0: [], 1: [], 2: []}
    for number, value in ((0, 0.8), (1, 0.9), (2, 0.1)):
        record = {M.EPOCH: 1 / 3, M.VALIDATION: 1, M.VAL_TOKEN_ACCURACY: value}  # the first step past a quarter
        history[number].append(record)
        decision = asha.on_trial_result(None, trials[number], record)
        assert decision == (TrialScheduler.STOP if number == 2 else TrialScheduler.CONTINUE)
    record = {M.EPOCH: 5 / 9, M.VALIDATION: 2, M.VAL_TOKEN_ACCURACY: 0.85}
    history[0].append(record)
    assert asha.on_trial_result(None, trials[0], record) == TrialScheduler.CONTINUE
    assert dict(RP.rungs(asha.bracket_of(0)))[0.5] == {"t0": 0.85}

    rebuilt = ResumableASHA(history, objective, **settings)
    rungs = dict(RP.rungs(rebuilt.bracket_of(0)))
    assert rungs[0.25] == {"past-0": 0.8, "past-1": 0.9, "past-2": 0.1} and rungs[0.5] == {"past-0": 0.85}
    assert rebuilt.stops(2) and not rebuilt.stops(1) and not rebuilt.stops(0)


def test_racing_the_incumbent_lets_on_only_a_trial_as_good_as_the_best_at_its_rung_and_resumes_the_same():
    """Factor 2, rungs at 1 and 2 epochs. ASHA would let a trial above the rung's median on; racing
    stops every trial below the best recorded at that rung, and a tie goes on. Rebuilt from the
    trials' records, a continued trial below a rung's best is stopped again."""
    from sweeps.running.schedulers import RacingASHA

    objective = (Objective(metric=M.VAL_TOKEN_ACCURACY, mode="max"),)
    settings = {
        "time_attr": M.EPOCH,
        "metric": M.VAL_TOKEN_ACCURACY,
        "mode": "max",
        "max_t": 4,
        "grace_period": 1,
        "reduction_factor": 2,
    }
    race, asha = RacingASHA({}, objective, **settings), ResumableASHA({}, objective, **settings)
    values = {0: 0.5, 1: 0.9, 2: 0.7, 3: 0.9}  # trial 2 is above the median of 0.5 and 0.9, below the best
    decisions: dict[str, list[str]] = {"race": [], "asha": []}
    for name, scheduler in (("race", race), ("asha", asha)):
        for number, value in values.items():
            trial = _trial(number)
            scheduler.on_trial_add(None, trial)
            decisions[name].append(scheduler.on_trial_result(None, trial, {M.EPOCH: 1, M.VAL_TOKEN_ACCURACY: value}))
    go, stop = TrialScheduler.CONTINUE, TrialScheduler.STOP
    assert decisions["race"] == [go, go, stop, go]  # the first always; 0.7 < 0.9 stops; a tie with 0.9 goes on
    assert decisions["asha"] == [go, go, go, go]

    history = {n: [{M.EPOCH: 1, M.VAL_TOKEN_ACCURACY: v}] for n, v in values.items()}
    rebuilt = RacingASHA(history, objective, **settings)
    assert [rebuilt.stops(n) for n in values] == [True, False, True, False]


def test_a_sweep_file_naming_the_race_builds_the_racing_scheduler_within_the_sweeps_share():
    """`scheduler.type: race` in a sweep file gives the shared-cluster form of the race (one that
    keeps to the sweep's slots, as ASHA's does), and it races: at the first rung a trial worse than
    the best recorded there stops, where the file's ASHA (factor 2) lets it on."""
    from pathlib import Path

    from sweeps.running.schedulers import Preempting, RacingASHA, SharedASHA, rungs_for
    from sweeps.spec import sweep as spec_lib

    quickstart = Path(__file__).resolve().parents[1] / "sweeps" / "studies" / "quickstart.yaml"
    decisions: dict[str, list[str]] = {}
    for kind in ("race", "asha"):
        spec = spec_lib.load(quickstart, [f"scheduler.type={kind}"])
        scheduler = rungs_for(spec, {}, spec.base["train.epochs"])
        assert isinstance(scheduler, Preempting) and isinstance(scheduler, RacingASHA) == (kind == "race")
        assert isinstance(scheduler, SharedASHA) == (kind == "asha")
        scheduler.set_search_properties(M.VAL_TOKEN_ACCURACY, "max")  # as Tune sets the objective
        decisions[kind] = []
        for number, value in enumerate((0.5, 0.9, 0.7)):  # the third above the rung's median, below its best
            trial = _trial(number)
            scheduler.on_trial_add(None, trial)
            decisions[kind].append(scheduler.on_trial_result(None, trial, {M.EPOCH: 1, M.VAL_TOKEN_ACCURACY: value}))
    go, stop = TrialScheduler.CONTINUE, TrialScheduler.STOP
    assert decisions == {"race": [go, go, stop], "asha": [go, go, go]}
