"""Pareto fronts of several objectives: each point's rank by non-dominated sorting, and the
hypervolume a front dominates. Used by the sweep service's ASHA with several objectives
(:func:`behind`) and its export (a trial's ``pareto_rank``), by the report's front and by the
frontier's replay (``benchmarks/front_replay.py``); ``modes`` say each objective's direction, "min"
or "max"."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _minimized(values: np.ndarray | Sequence[Sequence[float]], modes: Sequence[str]) -> np.ndarray:
    """``values`` with every column turned to be minimized."""
    return np.asarray(values, dtype=float) * np.array([1.0 if mode == "min" else -1.0 for mode in modes])


def ranks(values: np.ndarray | Sequence[Sequence[float]], modes: Sequence[str]) -> np.ndarray:
    """Each row's Pareto rank: 1 for those no other row dominates (as good in every objective,
    better in one), then 1 + the rank of the worst-ranked row that dominates it, by peeling one
    front at a time."""
    points = _minimized(values, modes)
    n = len(points)
    as_good, better = np.ones((n, n), dtype=bool), np.zeros((n, n), dtype=bool)
    for column in points.T:  # [i, j]: i is as good as j in every objective, and better in one
        as_good &= column[:, None] <= column[None, :]
        better |= column[:, None] < column[None, :]
    dominates = as_good & better
    rank, left, front = np.zeros(n, dtype=int), np.ones(n, dtype=bool), 0
    while left.any():
        front += 1
        top = left & ~dominates[left].any(axis=0)  # dominated by none of the rows still left
        rank[top], left = front, left & ~top
    return rank


def behind(others: Sequence[Sequence[float]], mine: Sequence[float], keep: float) -> bool:
    """Whether ``mine`` falls outside the best ``keep`` share of ``others`` and itself, every
    objective maximized, by non-dominated sorting: the points are ranked (:func:`ranks`), the rank
    of the last point inside the share is the bar, and ``mine`` is behind when its rank is worse.
    Ties in rank share the bar's fate, so a point on the front is never behind. No others: not behind."""
    if not others:
        return False
    points = [*others, mine]
    rank = ranks(points, ["max"] * len(mine))
    bar = np.sort(rank)[max(1, math.ceil(len(points) * keep)) - 1]
    return bool(rank[-1] > bar)


def hypervolume(
    values: np.ndarray | Sequence[Sequence[float]], modes: Sequence[str], reference: Sequence[float]
) -> float:
    """The area that the points of two objectives dominate up to ``reference`` (a point every
    useful one beats): the sum of horizontal strips, one per point that lowers the second
    objective, the points taken by their first. A point not better than ``reference`` in both
    adds nothing; no point: 0."""
    if len(modes) != 2:
        raise ValueError(f"hypervolume of {len(modes)} objectives: only two are supported")
    points = _minimized(np.asarray(values, dtype=float).reshape(-1, 2), modes)
    ref = _minimized([reference], modes)[0]
    points = points[(points < ref).all(axis=1)]
    area, floor = 0.0, ref[1]
    for x, y in points[np.lexsort((points[:, 1], points[:, 0]))]:
        if y < floor:
            area += (ref[0] - x) * (floor - y)
            floor = y
    return float(area)
