"""The frontier's replay (research/front_replay.py) on synthetic tables whose answers are known."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from research import evidence_table as E
from research.front_replay import BUDGETS, METHODS, TARGETS, WORKERS, Point, front_hypervolume, replay, run, summarize
from research.replay import Curve

GRID, RANDOM, NSGA2, TPE, ASHA_RANDOM = METHODS[:5]


def tables(epochs: int = 3) -> dict[float, list[Curve]]:
    """The evidence table's 96 configurations at its three fractions, each epoch one CPU-second; a
    configuration's accuracy rises with its learning rate's rank and d_model's, and falls by 0.1
    with each halving of the latent; the test accuracy is the validation's less 0.01."""
    out = {}
    for fraction in E.FRACTIONS:
        curves = []
        for i, params in enumerate(E.CONFIGURATIONS):
            quality = (
                E.GRID["train.lr"].index(params["train.lr"])
                + E.GRID["model.d_model"].index(params["model.d_model"])
                + 0.01 * i
            ) / 7
            final = 0.3 + 0.6 * quality + 0.1 * math.log2(fraction / 0.5)
            val = tuple(final - 0.05 * (epochs - e) for e in range(1, epochs + 1))
            curves.append(Curve(i, params, val, tuple(v - 0.01 for v in val), (1.0,) * epochs))
        out[fraction] = curves
    return out


def test_the_front_is_chosen_on_validation_and_scored_on_test():
    """At 50% the more accurate trial on validation is the worse on test, and the front keeps it
    (the other would add 0.25); at 25% and 12.5% one trial each. Reference: accuracy 0.5 at the
    whole input. In log2 share: 0.6 over [-3, -2), 0.8 over [-2, -1) and, the 50% trial's 0.7
    being below it, over [-1, 0): 0.1 + 0.3 + 0.3."""

    def point(fraction: float, val: float, test: float) -> Point:
        return Point(fraction, Curve(0, {}, (val,), (test,), (1.0,)))

    points = [point(0.5, 0.9, 0.7), point(0.5, 0.85, 0.95), point(0.25, 0.8, 0.8), point(0.125, 0.7, 0.6)]
    assert front_hypervolume(points, 0.5) == pytest.approx(0.7)
    assert front_hypervolume([], 0.5) == 0.0


def test_the_grid_pays_for_every_training_and_returns_its_whole_front():
    trace = replay(tables(), GRID, seed=0)
    assert trace.trials == 3 * E.SIZE
    assert trace.shares[-1] == pytest.approx(1.0)
    assert all(0 < c <= 1.0 for c in trace.costs)
    assert list(trace.costs) == sorted(trace.costs) and len(trace.costs) == len(TARGETS)


@pytest.mark.parametrize("method", METHODS[1:], ids=lambda m: m.name)
def test_each_search_spends_the_last_budget_and_its_share_never_exceeds_what_the_front_can_score(method):
    trace = replay(tables(), method, seed=1)
    assert len(trace.shares) == len(BUDGETS)
    assert all(0.0 <= s <= 1.0 + 1e-9 for s in trace.shares)
    assert (
        trace.trials >= len(E.FRACTIONS) * E.SIZE * BUDGETS[-1] - WORKERS
    )  # the grid's cost, in 3-epoch trainings at least


def test_the_summary_rows_and_a_rerun_reads_the_file_back(tmp_path, monkeypatch):
    """``run`` on a table built from :func:`tables`; a second call replays nothing (its file holds
    every method) and summarizes the same numbers."""
    rows = [
        {
            "config_id": c.config_id,
            "latent_fraction": f,
            "seed": s,
            "epoch": e + 1,
            "val_token_accuracy": v,
            "test_token_accuracy": c.test[e],
            "cpu_seconds": c.cpu[e],
        }
        for s in E.SEEDS
        for f, curves in tables().items()
        for c in curves
        for e, v in enumerate(c.val)
    ]
    path = tmp_path / "table.parquet"
    pd.DataFrame(rows).to_parquet(path)
    first = run(range(0, 4), path, workers=1, methods=(GRID, RANDOM), folder=tmp_path)
    assert [r["method"] for r in first[:2]] == ["grid", "random"] and len(first) == 2 * len(TARGETS) + len(BUDGETS)
    assert all(r["vs_grid"].endswith("]") for r in first if r.get("method") == "random")
    monkeypatch.setattr("research.front_replay.replays", lambda *a: pytest.fail("replayed again"))
    assert run(range(0, 4), path, workers=1, methods=(GRID, RANDOM), folder=tmp_path) == first
    assert summarize([]) == [{"target": f"hypervolume share at {b:g}x grid"} for b in BUDGETS]


def test_multi_objective_asha_stops_trials_at_its_rungs_so_the_same_budget_starts_more():
    """On a table whose first epoch ranks as the last does, the service's ParetoASHA stops the
    trials behind at each rung: random search with it starts more trials for the grid's cost than
    without, and reaches each target for no more."""
    plain, stopped = replay(tables(), RANDOM, seed=2), replay(tables(), ASHA_RANDOM, seed=2)
    assert stopped.trials > 1.5 * plain.trials
    assert all(a <= b for a, b in zip(stopped.costs, plain.costs))
