"""The tabular replay (research/replay.py) on synthetic tables whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pandas as pd
import pytest

from research import evidence_table as E
from research import pack_replay
from research.replay import (
    METHODS,
    WARM_TOP,
    Curve,
    Method,
    Proposals,
    Run,
    first_rung_tau,
    methods_at,
    replay,
    replays,
    simulation,
    summarize,
    targets_for,
    warm_start,
)
from research.replay import (
    run as replay_all,
)
from seqae_core import metrics as M
from seqae_core.config import FREE_KEYS
from sweeps.running.schedulers import ResumableASHA
from sweeps.spec.sections import Objective

GRID, RANDOM, TPE, ASHA_RANDOM, ASHA_TPE = METHODS[:5]
HYPERBAND_RANDOM, HYPERBAND_TPE = (m for m in METHODS if m.scheduler == "hyperband")


def table(shift: float = 0.0, epochs: int = 4, seconds: float = 1.0) -> list[Curve]:
    """The evidence table's 96 configurations; a configuration's accuracy rises with its learning
    rate's rank and d_model's, by the same ranking at every epoch (so the first rung ranks as the end
    does); ``shift`` moves every value (another seed's table)."""
    curves = []
    for i, params in enumerate(E.CONFIGURATIONS):
        quality = (
            E.GRID["train.lr"].index(params["train.lr"])
            + E.GRID["model.d_model"].index(params["model.d_model"])
            + 0.01 * i
        ) / 7
        final = 0.3 + 0.6 * quality + shift
        val = tuple(final - 0.05 * (epochs - e) for e in range(1, epochs + 1))
        curves.append(Curve(i, params, val, tuple(v - 0.01 for v in val), (seconds,) * epochs))
    return curves


def evidence_rows() -> list[dict[str, float]]:
    """The evidence table's rows of two seeds of :func:`table`, as the replays read them from its parquet."""
    return [
        {
            "latent_fraction": 0.25,
            "seed": seed,
            "config_id": c.config_id,
            "epoch": e + 1,
            "val_token_accuracy": c.val[e],
            "test_token_accuracy": c.test[e],
            "cpu_seconds": c.cpu[e],
        }
        for seed, shift in ((1, 0.01), (2, 0.0))
        for c in table(shift)
        for e in range(len(c.val))
    ]


def test_a_grid_on_one_worker_pays_every_epoch_of_the_configurations_before_the_first_that_reaches():
    curves = table()
    best = max(max(c.val) for c in curves)
    for seed in range(3):
        trace = replay(curves, GRID, seed, (best,), workers=1)
        order = list(curves)
        np.random.default_rng(seed).shuffle(order)
        position = next(i for i, c in enumerate(order) if max(c.val) >= best)
        assert trace.costs == (4.0 * (position + 1),) and trace.trials_to == (position + 1,)
        assert trace.trials == 96 and trace.returned_test[-1] == pytest.approx(best - 0.01)
    assert replay(curves, GRID, 0, (2.0,), workers=1).costs == (math.inf,)  # out of reach: never


def test_two_workers_count_the_other_epoch_in_progress():
    """Two workers, epochs of 1 s started together: when the target's epoch ends, the other has run as long."""
    trace = replay(table(), GRID, 0, (0.0,), workers=2)
    assert trace.costs == (2.0,) and trace.trials_to == (2,)


def test_the_returned_configuration_is_scored_at_each_budget_from_what_had_ended():
    """Random search on 1 worker: at a quarter of the grid's cost it has ended 24 trainings, so it
    returns the best of those by validation, scored on test; and never better later than at 1x."""
    curves = table()
    trace = replay(curves, RANDOM, 3, (2.0,), workers=1)
    assert trace.trials == 96  # 96 trainings of 4 epochs fill the grid's cost
    assert trace.returned_test[0] <= trace.returned_test[1] <= trace.returned_test[2]


def test_a_trial_a_rung_pruned_is_never_returned_as_the_service_never_returns_one():
    """One configuration is the best of the table at its first epoch (0.99), then falls to 0 and
    keeps that first epoch's checkpoint (test 0.98): random search trains it to its end and returns
    it; under ASHA its second epoch is pruned behind the trial that reached the rung first, and it is
    never returned, though its first epoch reached the target. (Its later epochs cost nothing, so
    no budget ends while it trains on: a trial the budget stops is complete, and returned.)"""
    curves = table()
    spike = curves[40]
    curves[40] = Curve(spike.config_id, spike.params, (0.99, 0.0, 0.0, 0.0), (0.98,) * 4, (1.0, 0.0, 0.0, 0.0))
    plain = [replay(curves, RANDOM, seed, (0.99,), workers=1) for seed in range(12)]
    reached = [t.returned_test[-1] for t in plain if t.costs[0] < math.inf]
    assert reached, "no replay reached the target: the spike was never returned or refused"
    assert reached == [0.98] * len(reached)
    pruned = [
        t
        for t in (replay(curves, ASHA_RANDOM, seed, (0.99,), workers=1) for seed in range(12))
        if 1 < t.trials_to[0] < math.inf
    ]  # trained, and not first at the rung (the first is never pruned)
    assert len(pruned) >= 3, "too few replays trained the spike to tell"
    assert all(t.returned_test[-1] < 0.98 for t in pruned), [t.returned_test for t in pruned]


def test_asha_reaches_the_target_for_less_where_the_first_rung_ranks_as_the_end_does():
    curves = table()
    target = targets_for(curves)[1]
    costs = {m.name: [replay(curves, m, seed, (target,)).costs[0] for seed in range(10)] for m in (RANDOM, ASHA_RANDOM)}
    assert first_rung_tau(curves) == pytest.approx(1.0)
    assert all(c < math.inf for c in costs["random"] + costs["asha+random"])
    assert np.median(costs["asha+random"]) < np.median(costs["random"])


def test_the_target_is_cross_fitted_never_read_from_the_table_the_cost_comes_from():
    """Seed 1's table is 0.05 better everywhere than seed 2's: each replay's targets are the other
    table's percentiles, and the direction alternates with the replay seed."""
    tables = {1: table(0.05), 2: table(0.0)}
    runs = replays(tables, (GRID,), range(4))
    for run in runs:
        other = 2 if run.cost_seed == 1 else 1
        assert run.targets == targets_for(tables[other]) != targets_for(tables[run.cost_seed])
        assert run.best_test == max(c.test[-1] for c in tables[run.cost_seed])
    assert [r.cost_seed for r in runs] == [1, 2, 1, 2]


def test_the_summary_has_intervals_for_every_method_target_and_budget():
    tables = {1: table(0.01), 2: table(0.0)}
    runs: list[Run] = replays(tables, (GRID, ASHA_TPE), range(4))
    rows = summarize(runs, {1: 1.0, 2: 1.0})
    assert len(rows) == 2 * 3 + 2 * 3
    cost_rows = [r for r in rows if r["target"].startswith("p")]
    assert all(r["cpu_s_95ci"].startswith("[") and r["reached"].endswith("]") for r in cost_rows)
    assert {r["vs_grid"][:5] for r in cost_rows if r["method"] == "grid"} == {"1.00x"}
    assert all("first_rung_tau" in r for r in cost_rows if r["method"] == "asha+tpe")


def test_hyperband_draws_each_trials_bracket_from_its_number_so_every_session_agrees():
    """Nine epochs, grace 1, factor 2: brackets whose first rungs are at epochs 1, 2, 4 and 8, most
    trials in the first (Ray's odds); a trial's bracket is the same in a new scheduler (a resumed
    driver's), with the rungs it passed rebuilt there."""

    def scheduler(history=None):
        return ResumableASHA(
            history or {},
            (Objective(metric=M.VAL_TOKEN_ACCURACY, mode="max"),),
            time_attr=M.EPOCH,
            metric=M.VAL_TOKEN_ACCURACY,
            mode="max",
            max_t=9,
            grace_period=1,
            reduction_factor=2,
            brackets=4,
        )

    first, again = (
        scheduler(),
        scheduler({7: [{M.EPOCH: 2, M.VAL_TOKEN_ACCURACY: 0.5}, {M.EPOCH: 4, M.VAL_TOKEN_ACCURACY: 0.6}]}),
    )
    assert [int(b._rungs[-1][0]) for b in first._brackets] == [1, 2, 4, 8]
    counts = np.bincount([first._brackets.index(first.bracket_of(n)) for n in range(1000)], minlength=4)
    assert counts[0] > counts[1] > counts[2] > counts[3] > 0
    assert [again._brackets.index(again.bracket_of(n)) for n in range(50)] == [
        first._brackets.index(first.bracket_of(n)) for n in range(50)
    ]
    # its rungs passed, in its own bracket only, each holding the first record at or past it (as
    # Tune's ASHA records a result): the epoch-2 record for rungs 1 and 2, epoch 4's for rung 4
    rungs = again.bracket_of(7)._rungs
    assert {m: r.get("past-7") for m, r in rungs} == {m: {1: 0.5, 2: 0.5, 4: 0.6}.get(int(m)) for m, _ in rungs}
    assert any(r.get("past-7") is None for _, r in rungs)  # rung 8, not yet reached, holds nothing
    assert all("past-7" not in r for b in again._brackets if b is not again.bracket_of(7) for _, r in b._rungs)


def test_the_model_finds_the_best_configuration_for_less_than_random_search_where_the_table_is_smooth():
    """Accuracy rises with the learning rate's and d_model's ranks: TPE, with ASHA or Hyperband,
    reaches the best configuration's accuracy in fewer CPU-seconds than random search with the same
    scheduler, over ten replay seeds (medians)."""
    curves = table()
    best = (max(max(c.val) for c in curves) - 0.02,)
    for model, baseline in ((ASHA_TPE, ASHA_RANDOM), (HYPERBAND_TPE, HYPERBAND_RANDOM)):
        costs = {
            m.name: [replay(curves, m, seed, best, budgets=(1.0,)).costs[0] for seed in range(10)]
            for m in (model, baseline)
        }
        assert np.median(costs[model.name]) < np.median(costs[baseline.name]), costs


def test_a_warm_start_runs_the_earlier_searchs_best_configurations_first():
    """From a table ranked as this one, the earlier search's five best run first: the best is
    reached within those five trials, from the table the other seed's targets are read from."""
    curves, other = table(), table(0.001)
    warm = Method("asha+tpe warm", "tpe", "asha", warm_from=0.5)
    assert warm_start(other) == tuple(c.params for c in sorted(other, key=lambda c: max(c.val))[::-1][:WARM_TOP])
    best = (max(max(c.val) for c in curves),)
    trace = replay(curves, warm, 0, best, first=warm_start(other), budgets=(0.5,))
    assert trace.trials_to[0] <= WARM_TOP
    runs = replays({1: curves, 2: other}, (warm,), range(2), sources={1: curves, 2: other})
    assert all(r.trace.trials_to[0] <= WARM_TOP for r in runs)
    assert [m.name for m in methods_at(0.125)][-1] == "asha+tpe warm from 25.0%"


def test_a_rerun_replays_only_the_methods_its_file_lacks(tmp_path):
    """The replays are written a method at a time; a second call with one more method reads the
    others back (here marked, so a replay again would show) and replays only the new one."""
    rows = evidence_rows()
    path = tmp_path / "evidence.parquet"
    pd.DataFrame(rows).to_parquet(path)
    replay_all(range(3), 0.25, path, workers=1, methods=(GRID, RANDOM), folder=tmp_path)
    out = tmp_path / "replay-0250-seeds-0-2.parquet"
    first = pd.read_parquet(out)
    assert sorted(first.method.unique()) == ["grid", "random"] and len(first) == 6
    first.loc[first.method == "random", "trials"] = -1  # what a replay would never write
    first.to_parquet(out)
    rows = replay_all(range(3), 0.25, path, workers=1, methods=(GRID, RANDOM, ASHA_RANDOM), folder=tmp_path)
    again = pd.read_parquet(out)
    assert list(again.method.unique()) == ["grid", "random", "asha+random"] and len(again) == 9
    assert (again[again.method == "random"].trials == -1).all()
    assert {r["method"] for r in rows} == {"grid", "random", "asha+random"}


@pytest.mark.parametrize("method", [ASHA_RANDOM, ASHA_TPE], ids=["random", "tpe"])
def test_a_packs_members_share_the_first_proposals_shape_and_are_asked_while_the_earlier_are_pending(method):
    """After TPE's start-up too (ten trials told first): the first member is the sampler's own,
    the other three differ from it in free keys only (here the learning rate), every member is
    running when the pack is asked whole, and the sweep's sampler is back for the next pack."""
    proposals = Proposals(table(), simulation(method, 0, 4))
    for curve, trial in [p for _ in range(10) for p in proposals.ask()]:
        proposals.study.tell(trial, max(curve.val))
    own = proposals.study.sampler
    for _ in range(3):
        members = [trial for _, trial in proposals.ask(4)]
        shapes = [{k: v for k, v in t.params.items() if k not in FREE_KEYS} for t in members]
        assert len(members) == 4 and all(shape == shapes[0] for shape in shapes)
        assert all(t.number == members[0].number + i for i, t in enumerate(members))
        assert [t.state for t in proposals.study.get_trials()[-4:]] == [optuna.trial.TrialState.RUNNING] * 4
        assert proposals.study.sampler is own
        for trial in members:
            proposals.study.tell(trial, 0.5)


def test_a_packs_epoch_costs_its_members_epochs_and_ends_theirs_together():
    """Packs of 4 of 1-second epochs: on one worker the first epoch of each member ends at 4 s; on
    two, the other pack's epoch in progress counts as well (8 s), and 8 trials have started."""
    grid = Method("grid in packs", "grid", pack=4)
    assert replay(table(), grid, 0, (0.0,), workers=1).costs == (4.0,)
    assert replay(table(), grid, 0, (0.0,), workers=2).costs == (8.0,)
    assert replay(table(), grid, 0, (0.0,), workers=2).trials_to == (8,)
    assert replay(table(), grid, 0, (2.0,), workers=2).trials == 96


def test_a_stopped_member_leaves_and_its_pack_goes_on_without_a_new_one(monkeypatch):
    """Every configuration alike, reaching the target at its fourth epoch only; ASHA stops the odd
    trials at their first rung. In packs of 2 on one worker the first pack's first epoch costs 2
    s, then its even member trains alone to the target: 5 s, 2 trials. Without the stops both
    train on (8 s); one at a time, a trial alone reaches it at 4 s."""
    curves = [Curve(c.config_id, c.params, (0.1, 0.2, 0.3, 0.9), (0.1,) * 4, (1.0,) * 4) for c in table()]
    alone, pack = ASHA_RANDOM, pack_replay.packed(ASHA_RANDOM, 2)
    assert replay(curves, pack, 0, (0.9,), workers=1).costs == (8.0,)
    assert replay(curves, alone, 0, (0.9,), workers=1).costs == (4.0,)

    def decide(self, runner, trial, result):
        odd = int(trial.trial_id) % 2 == 1 and result[M.EPOCH] == 1
        return ResumableASHA.STOP if odd else ResumableASHA.CONTINUE

    monkeypatch.setattr(ResumableASHA, "on_trial_result", decide)
    trace = replay(curves, pack, 0, (0.9,), workers=1)
    assert trace.costs == (5.0,) and trace.trials_to == (2,)


def test_pack_replay_reads_one_at_a_time_from_a_replay_file_and_writes_only_its_packs(tmp_path):
    """The one-at-a-time replays come from a replay file holding more seeds (here marked, so a
    replay again would show); the packs are replayed and written, and a rerun reads them back. The
    summary pairs each packed method with the same sampler one at a time."""
    rows = evidence_rows()
    path = tmp_path / "evidence.parquet"
    pd.DataFrame(rows).to_parquet(path)
    replay_all(range(4), 0.25, path, workers=1, methods=(ASHA_RANDOM,), folder=tmp_path)
    alone = tmp_path / "replay-0250-seeds-0-3.parquet"
    marked = pd.read_parquet(alone).assign(trials=-1)  # what a replay would never write
    marked.to_parquet(alone)
    summary = pack_replay.run(range(1, 3), 2, 0.25, path, workers=1, methods=(ASHA_RANDOM,), folder=tmp_path)
    packs = pd.read_parquet(tmp_path / "pack-replay-0250-seeds-1-2.parquet")
    assert list(packs.method) == ["asha+random packs of 2"] * 2 and sorted(packs.seed) == [1, 2]
    costs = [r for r in summary if r["target"].startswith("p")]
    assert [r["method"] for r in costs[:2]] == ["asha+random", "asha+random packs of 2"]
    assert costs[1]["vs_one_at_a_time"].endswith("]") and costs[0]["vs_one_at_a_time"] == ""
    assert {r["trials_median"] for r in summary if r["method"] == "asha+random" and "regret" in r["target"]} == {"-1"}
    packs.assign(trials=-2).to_parquet(tmp_path / "pack-replay-0250-seeds-1-2.parquet")
    again = pack_replay.run(range(1, 3), 2, 0.25, path, workers=1, methods=(ASHA_RANDOM,), folder=tmp_path)
    assert {r["trials_median"] for r in again if "packs" in r["method"] and "regret" in r["target"]} == {"-2"}


# Issue 82's corrected protocol: ordered spaces, fresh proposals, cross-seed scoring, the
# first-rung model and racing the incumbent.
def _fresh(name: str, sampler: str, scheduler: str = "asha", **kwargs) -> Method:
    return Method(name, sampler, scheduler, space="ordered", fresh=True, **kwargs)


def test_an_ordered_space_samples_each_numeric_choice_as_the_index_of_its_level():
    """The learning rate's five levels are 0-4 to Optuna, the heads' two 0-1, the block a choice, as
    the service's ordered choices (``type: ordered``) declare them; a configuration goes into the
    study and comes back out as itself, and random search draws each level alike."""
    from research.replay import declared

    sweep = simulation(_fresh("o", "random"), 0, 4)  # random search, seeded 0
    assert sweep.spec.search["train.lr"].type == "ordered" and sweep.spec.search["model.block"].type == "categorical"
    for params in E.CONFIGURATIONS[:10]:
        sweep.enqueue(declared(params))
        (proposal,) = sweep.ask()
        assert proposal.params == declared(params)
        assert isinstance(proposal.trial.params["train.lr"], int) and isinstance(
            proposal.trial.params["model.block"], str
        )
    drawn = [sweep.ask()[0].params["train.lr"] for _ in range(2000)]
    assert min(drawn.count(lr) for lr in E.GRID["train.lr"]) > 350  # 400 each, none half as often
    assert sweep.study.trials[-1].distributions["train.lr"] == optuna.distributions.IntDistribution(0, 4)


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_fresh_proposals_train_every_configuration_once_and_the_study_records_the_one_trained(sampler):
    """96 proposals over the ordered space train the 96 configurations, each once, and each Optuna
    trial holds the trained configuration's values (so the sampler learns where the value was
    measured); a 97th finds none left."""
    curves = table()
    from research.replay import declared

    sweep = simulation(_fresh("f", sampler), 0, 4)
    proposals = Proposals(curves, sweep, fresh=True)
    seen = []
    for _ in range(96):
        [(curve, trial)] = proposals.ask()
        assert trial.params == sweep.recorded(declared(curve.params))
        proposals.study.tell(trial, max(curve.val))
        seen.append(curve.config_id)
    assert sorted(seen) == list(range(96))
    assert proposals.ask() == []


def test_a_fresh_replay_never_pays_twice_for_a_configuration_and_ends_when_none_is_left():
    """ASHA prunes most trials, so the grid's cost is not spent before every configuration is
    trained; a fresh method then stops proposing, where the published one trains copies."""
    curves = table()
    fresh = replay(curves, _fresh("asha+random", "random"), 0, (2.0,), workers=1)
    again = replay(curves, ASHA_RANDOM, 0, (2.0,), workers=1)
    assert fresh.trials == 96 < again.trials


def test_the_returned_configuration_is_scored_on_the_other_seeds_table_trained_as_long():
    """The other seed's table is 0.05 worse everywhere: a grid that trained everything returns the
    best configuration, scored 0.05 lower there; and the runs record that table's best."""
    curves, other = table(0.05), table(0.0)
    trace = replay(curves, GRID, 0, (2.0,), workers=1, score=other)
    assert trace.returned_cross[-1] == pytest.approx(trace.returned_test[-1] - 0.05)
    [run] = replays({1: curves, 2: other}, (GRID,), range(1))
    assert run.cost_seed == 1 and run.best_cross == max(c.test[-1] for c in other)
    assert run.trace.returned_cross == replay(curves, GRID, 0, run.targets, score=other).returned_cross


def test_the_first_rung_model_learns_of_every_trial_at_its_first_rung_value_pruned_or_not(monkeypatch):
    """Every trial the model sees is complete at its first epoch's value, a pruned one too; under
    the published model a pruned trial is PRUNED and a finished one holds its best value."""
    import research.replay as R

    studies = []

    class Recorded(R.Proposals):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            studies.append(self.study)

    monkeypatch.setattr(R, "Proposals", Recorded)
    from research.replay import declared

    curves = table()
    sweep = simulation(_fresh("m", "tpe"), 0, 4)
    by_params = {tuple(sorted(sweep.recorded(declared(c.params)).items())): c for c in curves}

    def curve_of(trial):
        return by_params[tuple(sorted(trial.params.items()))]

    replay(curves, _fresh("m", "tpe", model="first-rung"), 0, (2.0,), workers=1)
    told = studies[-1].get_trials(states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
    assert len(told) >= 90 and all(t.state == optuna.trial.TrialState.COMPLETE for t in told)
    assert all(t.value == curve_of(t).val[0] for t in told)
    replay(curves, _fresh("p", "tpe"), 0, (2.0,), workers=1)
    states = {
        t.state
        for t in studies[-1].get_trials(states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
    }
    assert states == {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}


def test_racing_the_incumbent_stops_more_trials_at_their_first_rung_than_asha():
    """Racing lets on only a trial as good as the best at its rung: in the same budget it starts
    more trials than ASHA, each trained less."""
    curves = table()
    race = [
        replay(curves, Method("race+random", "random", "race"), seed, (2.0,), workers=1).trials for seed in range(4)
    ]
    asha = [replay(curves, ASHA_RANDOM, seed, (2.0,), workers=1).trials for seed in range(4)]
    assert all(r > a for r, a in zip(race, asha)), (race, asha)


def test_the_learning_replay_meets_the_p90_target_only_at_half_the_grid_and_an_interval_below_0_6(tmp_path):
    """The summary's registered test, on runs whose costs are set: 0.45x of the grid's with every
    replay alike (the interval a point) is met, 0.55x is missed."""
    from research import learning_replay as L
    from research.replay import Trace

    def runs(method, cost):
        return [
            Run(
                method,
                s,
                1,
                (0.5, 0.7, 0.8),
                0.9,
                Trace((cost, cost, cost), (1, 1, 1), (0.8,) * 3, 10, (0.85, 0.87, 0.88)),
                0.9,
            )
            for s in range(20)
        ]

    rows = {r["method"]: r for r in L.summarize(runs("grid", 100.0) + runs("asha+random", 55.0) + runs("new", 45.0))}
    assert rows["new"]["p90_target"] == "met" and rows["asha+random"]["p90_target"] == "missed"
    assert (
        rows["new"]["regret_0.5x"] == "3.00 [3.00, 3.00]"
        and rows["new"]["vs_asha+random_0.5x"] == "+0.00 [+0.00, +0.00]"
    )


@pytest.mark.parametrize(
    "module, args, refusal",
    [
        ("replay", ["--seeds", "5-3"], "--seeds '5-3' is not a range FIRST-LAST"),
        ("replay", ["--fraction", "0.3"], "--fraction 0.3 is not a fraction of the evidence table"),
        ("pack_replay", ["--pack", "1"], "--pack 1 is not a pack"),
    ],
)
def test_a_research_command_refuses_a_mistake_in_one_line_before_replaying(module, args, refusal, capsys):
    """`python -m research.<module>`: a mistake is one line and exit status 2, as `seqae`'s, and
    nothing replays."""
    import importlib

    from research import command

    with pytest.raises(SystemExit) as ended:
        command.main(importlib.import_module(f"research.{module}").main, args)
    assert ended.value.code == 2 and capsys.readouterr().out.startswith(f"error: {refusal}")
