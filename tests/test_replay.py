"""The tabular replay (benchmarks/replay.py) on synthetic tables whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import evidence_table as E
from benchmarks.replay import METHODS, Curve, Run, first_rung_tau, replay, replays, summarize, targets_for

GRID, RANDOM, TPE, ASHA_RANDOM, ASHA_TPE = METHODS


def table(shift: float = 0.0, epochs: int = 4, seconds: float = 1.0) -> list[Curve]:
    """The evidence table's 96 configurations; a configuration's accuracy rises with its learning
    rate's rank and d_model's, by the same ranking at every epoch (so the first rung ranks as the end
    does); ``shift`` moves every value (another seed's table)."""
    curves = []
    for i, params in enumerate(E.CONFIGURATIONS):
        quality = (E.GRID["train.lr"].index(params["train.lr"]) + E.GRID["model.d_model"].index(params["model.d_model"])
                   + 0.01 * i) / 7
        final = 0.3 + 0.6 * quality + shift
        val = tuple(final - 0.05 * (epochs - e) for e in range(1, epochs + 1))
        curves.append(Curve(i, params, val, tuple(v - 0.01 for v in val), (seconds,) * epochs))
    return curves


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
