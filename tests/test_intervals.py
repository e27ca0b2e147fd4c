"""The benchmarks' intervals (research/intervals.py) on synthetic numbers with a known answer:
each 95% interval covers the truth in 93-97% of 1,000 simulated repetitions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from research.intervals import (
    bootstrap_mean,
    holm,
    median_interval,
    paired_ratio_interval,
    ratio_interval,
    sign_flip_p,
    simultaneous_level,
    t_interval,
    wilson,
)

REPETITIONS = 1000
COVERAGE = (0.93, 0.97)


def covered(intervals: list, truth: float) -> float:
    return float(np.mean([i.low <= truth <= i.high for i in intervals]))


@pytest.mark.parametrize("units", [3, 10], ids=["3 search seeds", "10 search seeds"])
def test_the_t_interval_over_search_seeds_covers_the_mean_gain(units):
    """Per-search-seed gains drawn around a true gain of 5 points, spread 4 points."""
    rng = np.random.default_rng(units)
    gains = rng.normal(0.05, 0.04, size=(REPETITIONS, units))
    share = covered([t_interval(g) for g in gains], 0.05)
    assert COVERAGE[0] <= share <= COVERAGE[1], share


def test_the_t_interval_of_three_seeds_is_wider_than_their_range_and_the_bootstrap_was_not():
    """The recomputation's case: 8.3, 8.7 and 0.0 points. Their t interval reaches below 0; a
    percentile bootstrap of three values is their range at most."""
    gains = [0.083, 0.087, 0.0]
    t = t_interval(gains)
    assert t.low < 0 < t.high and t.high - t.low > 2 * (max(gains) - min(gains))


def test_the_sign_flip_test_is_exact_and_holds_its_level():
    assert sign_flip_p([0.083, 0.087, 0.01]) == pytest.approx(1 / 8)  # 3 positive seeds: 2^-3 at best
    assert sign_flip_p([0.1] * 10) == pytest.approx(2**-10)
    assert sign_flip_p([-0.1, -0.2, -0.05]) == 1.0
    rng = np.random.default_rng(0)
    null = [sign_flip_p(rng.normal(0, 1, 10)) for _ in range(REPETITIONS)]
    rejected = float(np.mean(np.array(null) <= 0.05))  # under no gain, rejected at most 5% of the time
    assert rejected <= 0.05 + 0.015, rejected


def test_the_order_statistic_interval_covers_the_median_of_replay_costs():
    """Costs to a target: exponential with a known median (ln 2 x scale), and a fifth of the
    replays never reach it (infinite cost), which shifts the median to a known quantile."""
    rng = np.random.default_rng(1)
    scale, unreached = 300.0, 0.2
    truth = scale * math.log(1 / (1 - 0.5 / (1 - unreached)))  # the median of the mixture
    samples = rng.exponential(scale, size=(REPETITIONS, 400))
    samples[rng.random(samples.shape) < unreached] = math.inf
    share = covered([median_interval(s) for s in samples], truth)
    assert COVERAGE[0] <= share <= COVERAGE[1] + 0.01, share  # at least 95% by construction


def test_the_ratio_interval_covers_the_ratio_of_medians():
    rng = np.random.default_rng(2)
    truth = 0.5  # a method whose costs are half the grid's, in distribution
    intervals = [
        ratio_interval(rng.exponential(150.0, 200), rng.exponential(300.0, 200), draws=300, seed=r)
        for r in range(REPETITIONS)
    ]
    share = covered(intervals, truth)
    assert COVERAGE[0] <= share <= COVERAGE[1], share


def test_the_paired_ratio_interval_covers_the_ratio_of_medians_and_is_narrower_where_the_pairs_share_noise():
    """Log-normal costs whose medians are 150 and 300, the pairs sharing most of their spread (a
    replay seed's cost table, in the replays): covered at least as often as claimed (a little more:
    the median's bootstrap is coarse where the resampled pairs move together), and narrower than
    the unpaired interval."""
    rng = np.random.default_rng(5)
    intervals, unpaired = [], []
    for r in range(REPETITIONS):
        shared = rng.normal(0.0, 1.0, 200)
        a, b = 150.0 * np.exp(shared + rng.normal(0.0, 0.3, 200)), 300.0 * np.exp(shared + rng.normal(0.0, 0.3, 200))
        intervals.append(paired_ratio_interval(a, b, draws=300, seed=r))
        if r < 50:
            unpaired.append(ratio_interval(a, b, draws=300, seed=r))
    share = covered(intervals, 0.5)
    assert COVERAGE[0] <= share <= 0.99, share
    assert np.mean([i.high - i.low for i in intervals[:50]]) < 0.7 * np.mean([i.high - i.low for i in unpaired])


def test_wilsons_interval_covers_the_share_reached():
    rng = np.random.default_rng(3)
    share = covered([wilson(int(k), 1000) for k in rng.binomial(1000, 0.3, REPETITIONS)], 0.3)
    assert COVERAGE[0] <= share <= COVERAGE[1], share
    assert wilson(1000, 1000).high == 1.0 and wilson(1000, 1000).low > 0.99


def test_the_bootstrap_mean_covers_the_mean_regret():
    rng = np.random.default_rng(4)
    share = covered([bootstrap_mean(rng.exponential(2.0, 500), draws=400, seed=r) for r in range(REPETITIONS)], 2.0)
    assert COVERAGE[0] <= share <= COVERAGE[1], share


def test_holm_steps_down_and_keeps_the_order_given():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1, and never below an earlier step
    assert simultaneous_level(3) == pytest.approx(1 - 0.05 / 3)
