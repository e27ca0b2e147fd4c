"""Non-dominated sorting and the hypervolume, on points with a known answer."""

import itertools

import numpy as np
import optuna
import pytest

from seqae_core.pareto import behind, hypervolume, ranks
from sweeps.results.trials import pareto_ranks


def _finished(values: list[float], number: int) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(values=values, state=optuna.trial.TrialState.COMPLETE)
    trial.number = number
    return trial


def test_pareto_ranks_peel_one_front_at_a_time():
    """Accuracy up, latent share down: (0.9, 0.5), (0.8, 0.25) and (0.6, 0.125) are the front, and
    so is a tie with one of them; (0.7, 0.5) loses to (0.9, 0.5) and (0.8, 0.25) only; (0.6, 0.5)
    also to (0.7, 0.5). A failed trial has no rank."""
    points = [[0.9, 0.5], [0.8, 0.25], [0.6, 0.125], [0.7, 0.5], [0.6, 0.5], [0.8, 0.25]]
    trials = [_finished(v, i) for i, v in enumerate(points)]
    failed = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL)
    failed.number = 6
    assert pareto_ranks([*trials, failed], ["max", "min"]) == {0: 1, 1: 1, 2: 1, 3: 2, 4: 3, 5: 1}
    assert ranks(points, ["max", "min"]).tolist() == [1, 1, 1, 2, 3, 1]


def test_the_first_pareto_rank_is_optunas_front():
    rng = np.random.default_rng(0)
    study = optuna.create_study(directions=["maximize", "minimize", "minimize"])
    for values in rng.integers(0, 6, (60, 3)).tolist():  # small integers: many ties and dominated points
        study.add_trial(optuna.trial.create_trial(values=values, state=optuna.trial.TrialState.COMPLETE))
    by_trial = pareto_ranks(study.trials, ["max", "min", "min"])
    assert {n for n, r in by_trial.items() if r == 1} == {t.number for t in study.best_trials}
    assert max(by_trial.values()) > 2


def test_the_hypervolume_of_a_staircase_is_its_area():
    """Accuracy above 0.5 over the latent share up to 1: 0.6 over [0.125, 0.25), 0.8 over
    [0.25, 0.5), 0.9 over [0.5, 1): 0.1 x 0.125 + 0.3 x 0.25 + 0.4 x 0.5. A dominated point, one
    beyond the reference and a repeated one add nothing."""
    front = [[0.9, 0.5], [0.8, 0.25], [0.6, 0.125]]
    assert hypervolume(front, ["max", "min"], [0.5, 1.0]) == pytest.approx(0.2875)
    more = [*front, [0.7, 0.5], [0.4, 0.0625], [0.95, 1.5], [0.8, 0.25]]
    assert hypervolume(more, ["max", "min"], [0.5, 1.0]) == pytest.approx(0.2875)
    assert hypervolume([], ["max", "min"], [0.5, 1.0]) == 0.0


def test_the_hypervolume_of_integer_points_counts_the_unit_cells_they_dominate():
    """Both objectives minimized, points on a 12 x 12 lattice, the reference at its far corner: the
    cell [i, i+1) x [j, j+1) is dominated exactly when some point is at most (i, j)."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        points = rng.integers(0, 12, (int(rng.integers(1, 15)), 2))
        cells = sum(any(x <= i and y <= j for x, y in points) for i, j in itertools.product(range(12), repeat=2))
        assert hypervolume(points, ["min", "min"], [12, 12]) == cells


def test_the_hypervolume_of_three_objectives_is_refused():
    with pytest.raises(ValueError, match="3 objectives"):
        hypervolume([[0, 0, 0]], ["min", "min", "min"], [1, 1, 1])


def test_behind_keeps_the_best_share_by_rank_and_a_front_point_always():
    """Maximized: (3, 1), (1, 3) and (2, 2) are one front, (1, 1) is behind them all. Of five
    points the best half is 3 (ceil 2.5): the whole first front goes on, (1, 1) does not; a point
    that joins the front goes on whatever its rank among many; with no others nothing is behind."""
    front = [[3, 1], [1, 3], [2, 2]]
    assert behind([*front, [0, 0]], [1, 1], 1 / 2)
    assert not behind([*front, [0, 0]], [2.5, 1.5], 1 / 2)
    assert not behind([[5, 0]] * 9, [0, 5], 1 / 3)  # alone in its corner of the front
    assert behind([[5, 5]] * 9, [4, 4], 1 / 3)
    assert not behind([], [0, 0], 1 / 2)
    # one objective: below the best half of the others is behind, as Ray's cutoff would have it
    assert behind([[0.9], [0.8], [0.7]], [0.6], 1 / 2) and not behind([[0.9], [0.8], [0.7]], [0.85], 1 / 2)
