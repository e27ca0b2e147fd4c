"""The trials grouped as the paper compares them: Fig. 3's points by latent fraction, the seeds of
one configuration, the cells of a sweep's grid; and the test scores its claims are checked on
(:mod:`dashboards.claims`)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, TypedDict

from dashboards import claims
from dashboards.report.data import Trial


def by_fraction(scored: Iterable[tuple[Trial, float]]) -> claims.Points:
    """``(trial, value)`` pairs as Fig. 3's points: per input length, the mean value at each latent
    fraction (% of the input), in fraction order."""
    points: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t, value in scored:
        points[t.input_len][round(100 * t.fraction, 2)].append(value)
    return {n: sorted((f, sum(v) / len(v)) for f, v in by_f.items()) for n, by_f in points.items()}


def seed_groups(trials: list[Trial]) -> dict[str, list[Trial]]:
    """Trials that differ only in ``train.seed``, for groups of at least two seeds."""
    groups: dict[str, list[Trial]] = defaultdict(list)
    for t in trials:
        if t.accuracy and "train.seed" in t.params:
            key = {k: v for k, v in t.params.items() if k != "train.seed"}
            label = f"{t.input_len}to{t.latent_len}, lr {key.get('train.lr')} {key.get('train.lr_schedule', '')}"
            groups[json.dumps(key, sort_keys=True) + "\0" + label].append(t)
    return {k.split("\0")[1]: v for k, v in groups.items() if len({t.params["train.seed"] for t in v}) >= 2}


def _measured(trials: list[Trial]) -> list[Trial]:
    """The trials a claim is checked on: complete grid cells (no starting point) with a test score."""
    return [t for t in trials if t.state == "complete" and t.start is None and t.test is not None]


def test_points(trials: list[Trial]) -> claims.Points:
    """Test accuracy against the latent fraction (mean over a cell's trials), per input length."""
    return by_fraction((t, t.test) for t in _measured(trials))  # type: ignore[misc]


def seed_spreads(trials: list[Trial]) -> claims.Spreads:
    """Test accuracy per seed, by (input length, latent length, static or warm-start lr)."""
    spreads: claims.Spreads = defaultdict(list)
    for group in seed_groups(_measured(trials)).values():
        for t in group:
            lr, final = float(t.params.get("train.lr", 0)), float(t.params.get("train.lr_final", 0))
            static = t.params.get("train.lr_schedule") == "constant" or lr == final
            spreads[(t.input_len, t.latent_len, "static" if static else "warm")].append(t.test)  # type: ignore[arg-type]
    return dict(spreads)


class GridRow(TypedDict):
    label: str  # what differs from the first row
    cells: list[str]  # the mean best accuracy per column, "" where no trial has one


class GridData(TypedDict):
    """The grid template's table (:func:`grid_data`)."""

    caption: str
    cols: list[str]
    rows: list[GridRow]


def grid_data(trials: list[Trial], grid: dict[str, tuple[Any, ...]]) -> GridData | None:
    """Best accuracy per grid cell (``grid``: a sweep's axes): a column per value of its first grid axis, a row per
    combination of the others (e.g. the ablation's variants by latent length). A row is labelled
    by what differs from the first row. None without a grid of two axes or a trial with a result."""
    axes = [axis.split(",") for axis in grid]
    if len(axes) < 2:
        return None
    col_keys, row_keys = axes[0], [k for axis in axes[1:] for k in axis]
    cells: dict[tuple[str, tuple[str, ...]], list[float]] = defaultdict(list)
    cols: dict[str, None] = {}
    rows: dict[tuple[str, ...], None] = {}
    for t in trials:
        if t.best is None:
            continue
        col = ", ".join(str(t.params.get(k)) for k in col_keys)
        row = tuple(str(t.params.get(k)) for k in row_keys)
        cols.setdefault(col)
        rows.setdefault(row)
        cells[(col, row)].append(t.best)
    if not rows:
        return None
    names = [k.split(".", 1)[1] for k in row_keys]
    first = next(iter(rows))

    def label(row: tuple[str, ...]) -> str:
        changed = [f"{n}={v}" for n, v, f in zip(names, row, first) if v != f or row == first]
        return ", ".join(changed)

    def mean(values: list[float] | None) -> str:
        return f"{sum(values) / len(values):.4f}" if values else ""

    return {
        "caption": f"best val_token_accuracy; columns: {', '.join(col_keys)}",
        "cols": list(cols),
        "rows": [{"label": label(row), "cells": [mean(cells.get((c, row))) for c in cols]} for row in rows],
    }
