"""Intervals for the differences the benchmarks claim.

A search arm's gain over the recipe is paired by training seed: ``gains[s, t]`` is the test
accuracy of search seed s's chosen configuration trained from seed t, minus the recipe's from
the same seed t, so what the training seed does to both cancels. The interval resamples the
design's two levels as they were drawn: search seeds with replacement, then, within each, training
seeds with replacement. Several claims at once are corrected with Holm's step-down method.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    p: float  # one-sided: the share of resampled means at or below 0 (no gain)


def resampled_means(gains: np.ndarray, draws: int = 10_000, seed: int = 0) -> np.ndarray:
    """The mean gain of ``draws`` two-level resamples of ``gains`` (search seeds x training seeds)."""
    gains = np.asarray(gains, dtype=float)
    searches, trainings = gains.shape
    rng = np.random.default_rng(seed)
    outer = rng.integers(0, searches, size=(draws, searches))
    inner = rng.integers(0, trainings, size=(draws, searches, trainings))
    return gains[outer[..., None], inner].mean(axis=(1, 2))


def interval(gains: np.ndarray, level: float = 0.95, draws: int = 10_000, seed: int = 0) -> Interval:
    """The mean gain, its two-sided ``level`` percentile interval, and the one-sided p of no gain."""
    means = resampled_means(gains, draws, seed)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(float(np.mean(gains)), float(low), float(high), float(np.mean(means <= 0)))


def holm(p_values: list[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given: a claim holds at level a when its adjusted p < a."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
