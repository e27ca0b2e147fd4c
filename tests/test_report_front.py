"""The report's front of a two-objective sweep, on points with a known answer: chosen on
validation, scored on test, its hypervolume as trials ended against what they had spent."""

from __future__ import annotations

import datetime

import optuna
import pandas as pd
import pytest

from dashboards.report.front import front, grid_front
from seqae_core import names as N

METRICS, MODES = ["val_token_accuracy", "latent_share"], ["max", "min"]


def _trial(
    number: int,
    minute: int,
    values: list[float] | None,
    test: float | None = None,
    state: optuna.trial.TrialState = optuna.trial.TrialState.COMPLETE,
) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(
        state=state, values=values, user_attrs={N.TEST: {"test_token_accuracy": test}} if test is not None else {}
    )
    trial.number = number
    trial.datetime_complete = datetime.datetime(2026, 1, 1, 0, minute)
    return trial


def test_the_front_is_chosen_on_validation_scored_on_test_and_its_hypervolume_follows_the_spend():
    trials = [
        _trial(3, 4, [0.4, 0.5], test=0.9),  # dominated on validation: its better test score is not the front's
        _trial(0, 1, [0.9, 0.5], test=0.8),
        _trial(2, 3, [0.5, 0.25], test=0.6),
        _trial(1, 2, None, state=optuna.trial.TrialState.PRUNED),
        _trial(4, 5, [0.95, 0.125]),
    ]  # no test score: not drawn, not scored
    found = front(trials, METRICS, MODES, {0: 10.0, 1: 5.0, 2: 10.0, 3: 10.0, 4: 10.0})
    assert found is not None
    # the reference: a tenth of each objective's range beyond its worst value, on validation or test
    assert found.reference == pytest.approx((0.4 - 0.05, 0.5 + 0.025))
    assert sorted(found.front) == [(0.6, 0.25), (0.8, 0.5)]
    assert sorted(found.points) == [(0.6, 0.25), (0.8, 0.5), (0.9, 0.5)]
    assert found.spent == [10.0, 25.0, 35.0]  # the pruned trial's cost counts from when it ended
    first = 0.55 * 0.025
    assert found.validation == pytest.approx([first, first + 0.15 * 0.25, first + 0.15 * 0.25])
    assert found.test == pytest.approx([0.45 * 0.025, 0.25 * 0.275 + 0.2 * 0.025, 0.25 * 0.275 + 0.2 * 0.025])


def test_no_front_without_two_objectives_or_a_test_score():
    assert front([_trial(0, 1, [0.9, 0.5])], METRICS, MODES, {}) is None
    assert front([_trial(0, 1, [0.9], test=0.8)], METRICS[:1], MODES[:1], {}) is None


def test_the_grid_front_is_its_kept_checkpoints_front_on_validation_at_the_input_length(tmp_path):
    rows = [  # input_len, float_share, val, test, epoch, kept_epoch
        (16, 0.5, 0.90, 0.88, 2, 2),
        (16, 0.5, 0.95, 0.93, 1, 2),  # not the kept epoch
        (16, 0.25, 0.70, 0.72, 2, 2),
        (16, 0.5, 0.80, 0.99, 2, 2),  # dominated on validation
        (32, 0.125, 0.99, 0.99, 2, 2),
    ]  # another input length
    table = pd.DataFrame(
        rows, columns=["input_len", "float_share", "val_token_accuracy", "test_token_accuracy", "epoch", "kept_epoch"]
    ).assign(trained_on="wiki", scored_on="wiki", part="fig3")
    table.loc[len(table)] = [16, 0.125, 0.99, 0.99, 2, 2, "wiki", "wiki", "sweep"]  # not the grid's
    path = tmp_path / "frontier.parquet"
    table.to_parquet(path)
    assert sorted(grid_front(path, 16, METRICS, MODES)) == [(0.72, 0.25), (0.88, 0.5)]
    assert sorted(grid_front(path, 16, METRICS[::-1], MODES[::-1])) == [(0.25, 0.72), (0.5, 0.88)]
    assert grid_front(path, 64, METRICS, MODES) is None
    assert grid_front(path, 16, ["val_token_accuracy", "latent_floats"], MODES) is None
    assert grid_front(tmp_path / "missing.parquet", 16, METRICS, MODES) is None
