"""ASHA with rungs below an epoch replayed on a quarter-epoch table (research/subepoch_rungs.py),
on synthetic tables whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from research import evidence_table as E
from research import subepoch_rungs as S
from seqae_errors import ConfigError

GRID, RANDOM, ASHA_EPOCH, ASHA_HALF, ASHA_QUARTER = S.METHODS[:5]


def quarter_table(
    shift: float = 0.0, epochs: int = 9, train: float = 0.6, scoring: float = 0.4, seeds: tuple[int, ...] = E.SEEDS
) -> pd.DataFrame:
    """The evidence table's configurations validated at each quarter: accuracy rises with the
    learning rate's rank and d_model's, ranked the same at every quarter (so the first quarter
    ranks as the end does); every quarter costs ``train`` CPU-seconds of steps and ``scoring`` of
    validation."""
    rows = []
    for seed in seeds:
        for i, params in enumerate(E.CONFIGURATIONS):
            quality = (
                E.GRID["train.lr"].index(params["train.lr"])
                + E.GRID["model.d_model"].index(params["model.d_model"])
                + 0.01 * i
            ) / 7
            final = 0.3 + 0.6 * quality + shift * (seed == seeds[0])
            for q in range(1, 4 * epochs + 1):
                val = final - 0.01 * (4 * epochs - q)
                rows.append(
                    {
                        "seed": seed,
                        "config_id": i,
                        "epoch": q / 4,
                        "val_token_accuracy": val,
                        "test_token_accuracy": val - 0.01,
                        "cpu_seconds": train + scoring,
                        "validation_cpu_seconds": scoring,
                    }
                )
    return pd.DataFrame(rows)


def test_a_method_pays_the_steps_of_every_quarter_and_only_the_validations_it_runs():
    table = quarter_table()
    by_every = {every: S.curves(table, 1, every) for every in (1.0, 0.5, 0.25)}
    assert [len(by_every[e][0].val) for e in (1.0, 0.5, 0.25)] == [9, 18, 36]
    assert by_every[1.0][0].cpu == pytest.approx((4 * 0.6 + 0.4,) * 9)
    assert by_every[0.5][0].cpu == pytest.approx((2 * 0.6 + 0.4,) * 18)
    assert by_every[0.25][0].cpu == pytest.approx((1.0,) * 36)
    quarters = table[(table.seed == 1) & (table.config_id == 0)].val_token_accuracy.to_numpy()
    assert by_every[1.0][0].val == tuple(quarters[3::4]) and by_every[0.5][0].val == tuple(quarters[1::2])


def test_the_grid_and_the_targets_are_read_once_an_epoch_whatever_the_method_validates():
    table = quarter_table(shift=0.02)
    views = {s: S.Views({e: S.curves(table, s, e) for e in (1.0, 0.25)}) for s in E.SEEDS}
    grid, quarter = S._one(views, GRID, 0), S._one(views, ASHA_QUARTER, 0)
    assert grid.targets == quarter.targets  # the other seed's best epoch-end validations
    assert grid.trace.trials == 96  # the grid trained every configuration ...
    assert grid.best_test == quarter.best_test
    one_epoch_grid = 96 * 9 * (4 * 0.6 + 0.4)  # ... validated once an epoch: its budgets' unit
    first = S._one(views, GRID, 0).trace
    assert max(c for c in first.costs if c < math.inf) <= one_epoch_grid


def test_quarter_rungs_reach_the_target_for_less_where_the_first_quarter_ranks_as_the_end_does():
    """With validation cheap beside a quarter's steps; where it is not, the extra validations can
    cost more than the earlier cut saves, which is what the measurement weighs."""
    table = quarter_table(train=0.95, scoring=0.05)
    views = {s: S.Views({e: S.curves(table, s, e) for e in (1.0, 0.5, 0.25)}) for s in E.SEEDS}
    runs = S.replays(views, (ASHA_EPOCH, ASHA_QUARTER), range(4), workers=1)
    cost = {
        m.name: np.median([r.trace.costs[1] for r in runs if r.method == m.name]) for m in (ASHA_EPOCH, ASHA_QUARTER)
    }
    assert all(c < math.inf for c in cost.values())
    assert cost[ASHA_QUARTER.name] < cost[ASHA_EPOCH.name]
    assert S.first_rung_tau(views[1], 0.25) == pytest.approx(1.0)


def test_the_summary_says_met_or_missed_on_the_quarter_rows_of_the_p90_target_only():
    table = quarter_table(shift=0.01)
    views = {s: S.Views({e: S.curves(table, s, e) for e in (1.0, 0.25)}) for s in E.SEEDS}
    methods = (GRID, ASHA_EPOCH, ASHA_QUARTER)
    rows = S.summarize(S.replays(views, methods, range(2), workers=1), methods, {1.0: 0.9, 0.25: 0.8})
    verdicts = [(r["target"], r["method"], r["target_0.5x"]) for r in rows if "target_0.5x" in r]
    assert [(t, m) for t, m, _ in verdicts] == [("p90", ASHA_QUARTER.name)]
    assert verdicts[0][2] in ("met", "missed")
    assert len(rows) == 3 * 3 + 3 * 3
    assert {r["vs_grid"][:5] for r in rows if r["method"] == "grid" and r["target"].startswith("p")} == {"1.00x"}


def test_a_table_short_of_configurations_is_refused_with_the_command_that_builds_it(tmp_path):
    path = tmp_path / "quarters.parquet"
    quarter_table(seeds=(1,)).to_parquet(path)
    with pytest.raises(ConfigError, match="python -m research.evidence_table --quarters"):
        S.run(range(2), path, workers=1, folder=tmp_path)
