"""A two-objective sweep's front: chosen on validation among its complete trials, scored on the
test pages, beside the published grid's front where the table has the sweep's input length, with
its hypervolume as the trials ended; written as ``front.json`` and ``front.png``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import optuna
import pandas as pd
from matplotlib.ticker import FuncFormatter, NullFormatter

from dashboards.report.data import Trial
from dashboards.report.figures import save_figure
from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.pareto import hypervolume, ranks
from sweeps.stores.workspace import SweepState

# The published compression frontier's grid (research/frontier.py, beside the package): its trainings
# at 16-128 input tokens on 30 pages of the offline corpus at their kept epoch, shipped as package data.
GRID_FRONTIER = Path(__file__).with_name("grid-frontier.parquet")
GRID_PARTS = ("fig3", "width")  # its grid's trainings (the others: a sweep, and a cell trained again)


def on_test(trial: optuna.trial.FrozenTrial, metrics: list[str]) -> tuple[float, ...] | None:
    """The trial's objectives measured on the test pages: each ``val_x`` as ``test_x``, the others
    (a latent's size) as they are; None without a test score."""
    test = trial.user_attrs.get(N.TEST) or {}
    values = [
        test.get(m.replace("val_", "test_", 1)) if m.startswith("val_") else v
        for m, v in zip(metrics, trial.values or [])
    ]
    return tuple(float(v) for v in values if v is not None) if values and None not in values else None


@dataclass(frozen=True)
class Front:
    """A two-objective sweep's front: chosen on validation among its complete trials, scored on
    test; and its hypervolume as the trials ended, against the resource-seconds they had spent."""

    metrics: list[str]
    modes: list[str]
    points: list[tuple[float, ...]]  # every complete trial with a test score, on test
    front: list[tuple[float, ...]]  # the validation front's trials, on test
    spent: list[float]  # resource-seconds of the trials ended by each trial's end
    validation: list[float]  # the validation front's hypervolume then, on validation
    test: list[float]  # and on test
    reference: tuple[float, ...]  # the hypervolumes' reference (:func:`_reference`)


def _reference(seen: np.ndarray, mode: str) -> float:
    """The hypervolume's reference in one objective: a tenth of the values' range beyond the worst
    value seen, on validation or test, so that the points at the edge of the front add area too."""
    worst, best = (seen.min(), seen.max()) if mode == "max" else (seen.max(), seen.min())
    span = abs(best - worst) or max(abs(worst), 1.0)
    return float(worst - 0.1 * span if mode == "max" else worst + 0.1 * span)


def front(
    trials: list[optuna.trial.FrozenTrial],
    metrics: list[str],
    modes: list[str],
    costs: dict[int, float],
    beside: list[tuple[float, ...]] | None = None,
) -> Front | None:
    """The :class:`Front` of ``trials`` (a study's), ``costs`` each trial's resource-seconds by
    number, the hypervolumes' reference also beyond the points ``beside`` (another front drawn with
    it, scored in the same box); None unless two objectives and a complete trial with a test score."""
    ended = sorted(
        (t for t in trials if t.state.is_finished() and t.datetime_complete is not None),
        key=lambda t: (t.datetime_complete, t.number),
    )
    tested = {
        t.number: point
        for t in ended
        if t.state == optuna.trial.TrialState.COMPLETE and t.values and (point := on_test(t, metrics)) is not None
    }
    if len(metrics) != 2 or not tested:
        return None
    valid = {t.number: tuple(t.values) for t in ended if t.number in tested}
    seen = np.array([*valid.values(), *tested.values(), *(beside or [])])
    reference = tuple(_reference(seen[:, i], mode) for i, mode in enumerate(modes))

    def first(numbers: list[int]) -> list[int]:
        return [n for n, rank in zip(numbers, ranks([valid[n] for n in numbers], modes)) if rank == 1]

    spent, validation, test, total = [], [], [], 0.0
    top: list[int] = []  # the front so far: a new trial's front is that of the old front and itself
    for t in ended:
        total += costs.get(t.number, 0.0)
        if t.number in tested:
            top = first([*top, t.number])
            spent.append(total)
            validation.append(hypervolume([valid[n] for n in top], modes, reference))
            test.append(hypervolume([tested[n] for n in top], modes, reference))
    return Front(metrics, modes, list(tested.values()), [tested[n] for n in top], spent, validation, test, reference)


def grid_front(path: Path, input_len: int, metrics: list[str], modes: list[str]) -> list[tuple[float, ...]] | None:
    """The published grid's front at ``input_len`` (its trainings' kept checkpoints, chosen on
    validation, on test) in the sweep's objectives, where the table has them: validation token
    accuracy and the latent share; else None."""
    columns = {
        M.VAL_TOKEN_ACCURACY: ("val_token_accuracy", "test_token_accuracy"),
        M.LATENT_SHARE: ("float_share", "float_share"),
    }
    if not path.exists() or sorted(metrics) != sorted(columns):
        return None
    table = pd.read_parquet(path)
    kept = table[
        table["part"].isin(GRID_PARTS)
        & (table["epoch"] == table["kept_epoch"])
        & (table["trained_on"] == table["scored_on"])
        & (table["input_len"] == input_len)
    ]
    if kept.empty:
        return None
    rank = ranks(kept[[columns[m][0] for m in metrics]].to_numpy(), modes)
    return [tuple(row) for row in kept[rank == 1][[columns[m][1] for m in metrics]].to_numpy()]


def _staircase(points: list[tuple[float, ...]], x: int, y: int) -> tuple[list[float], list[float]]:
    ordered = sorted(points, key=lambda p: p[x])
    return [p[x] for p in ordered], [p[y] for p in ordered]


def front_figure(found: Front, grid: list[tuple[float, ...]] | None, input_len: int, unit: str, out: Path) -> Path:
    """The front on test (every complete trial, the validation front joined, the grid's front
    overlaid) beside the hypervolume against the resource-seconds spent."""
    y = next((i for i, m in enumerate(found.metrics) if "accuracy" in m), 0)
    x = 1 - y
    label = [m.replace("val_", "test ", 1).replace("_", " ") for m in found.metrics]
    fig, (ax, hv) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax.scatter(*_staircase(found.points, x, y), color="#bbb", s=18, label="complete trials")
    ax.plot(
        *_staircase(found.front, x, y),
        marker="o",
        drawstyle="steps-post" if found.modes[x] == "min" else "steps-pre",
        color="C0",
        label="the sweep's front (chosen on validation)",
    )
    if grid:
        ax.plot(
            *_staircase(grid, x, y),
            marker="s",
            linestyle="--",
            drawstyle="steps-post",
            color="C3",
            label=f"the published grid's front, {input_len} tokens (benchmarks/tables/frontier.parquet)",
        )
    if found.metrics[x] == M.LATENT_SHARE:
        ax.set_xscale("log", base=2)  # a tick at each halving of the latent
        ax.xaxis.set_major_formatter(FuncFormatter(lambda share, _: f"{100 * share:g}%"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel=label[x], ylabel=label[y], title="The front on the test pages (never selected on)")
    hv.plot(found.spent, found.validation, marker=".", drawstyle="steps-post", label="validation")
    hv.plot(found.spent, found.test, marker=".", drawstyle="steps-post", label="test")
    if grid:
        hv.axhline(
            hypervolume(grid, found.modes, found.reference),
            color="C3",
            linestyle="--",
            label="the published grid's front, test",
        )
    hv.set(
        xlabel=f"{unit}-seconds spent by the trials ended",
        ylabel="hypervolume",
        title="The front's hypervolume as trials ended",
    )
    for a in (ax, hv):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    return save_figure(fig, out / "front.png")


def sweep_front(state: SweepState, trials: list[Trial], out: Path) -> Path | None:
    """The front of sweep ``state``, its numbers written to ``front.json`` and its figure
    (:func:`front_figure`) returned; None unless the sweep has two objectives and a complete
    trial with a test score."""
    objectives = state.spec.objectives
    if len(objectives) != 2:
        return None
    study = optuna.load_study(study_name=state.study_name, storage=state.backends.optuna_storage)
    metrics = [o.metric for o in objectives]
    modes: list[str] = [o.mode for o in objectives]
    lengths = {t.input_len for t in trials}
    input_len = lengths.pop() if len(lengths) == 1 else 0
    grid = grid_front(GRID_FRONTIER, input_len, metrics, modes)
    found = front(study.get_trials(deepcopy=False), metrics, modes, {t.number: t.cost or 0.0 for t in trials}, grid)
    if found is None:
        return None
    (out / "front.json").write_text(json.dumps({**asdict(found), "grid": grid}, indent=1))
    return front_figure(found, grid, input_len, trials[0].resource, out)
