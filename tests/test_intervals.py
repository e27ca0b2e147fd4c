"""The benchmarks' intervals (benchmarks/intervals.py) on synthetic numbers with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.intervals import holm, interval, resampled_means


def test_pairing_by_training_seed_cancels_what_the_seed_does_to_both_arms():
    """Each training seed moves both arms by the same large amount; the arm is 0.01 better at every
    seed. Paired, the gain is exactly 0.01 with no width; unpaired, the seeds' spread swamps it."""
    seed_effect = np.array([-0.05, 0.0, 0.07])
    recipe = 0.80 + seed_effect
    arm = np.array([0.81 + seed_effect for _ in range(3)])  # 3 search seeds x 3 training seeds
    paired = interval(arm - recipe)
    assert paired.mean == pytest.approx(0.01) and paired.low == pytest.approx(0.01) and paired.high == pytest.approx(0.01)
    assert paired.p == 0.0
    unpaired = interval(arm - recipe.mean())  # each cell against the recipe's mean: the seed's effect stays
    assert unpaired.low < 0 < unpaired.high and unpaired.p > 0.05


def test_the_interval_resamples_search_seeds_then_training_seeds():
    """A design whose search seeds differ (one much better) and whose training seeds do not: the
    resampled means take only the values means of search-seed multisets can take."""
    gains = np.array([[0.0, 0.0], [0.0, 0.0], [0.3, 0.3]])
    means = resampled_means(gains, draws=4000, seed=1)
    assert set(np.round(means, 6)) == {0.0, 0.1, 0.2, 0.3}
    assert np.mean(means == 0.0) == pytest.approx((2 / 3) ** 3, abs=0.03)  # no draw of the good seed
    result = interval(gains)
    assert result.mean == pytest.approx(0.1) and result.low == 0.0 and result.high == pytest.approx(0.3)


def test_holm_steps_down_and_keeps_the_order_given():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1, and never below an earlier step
