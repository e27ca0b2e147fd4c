"""``seqae report NAME``: the paper's figures and the search's story, from a sweep's MLflow runs.

The report is one self-contained HTML file (figures embedded as PNG data) plus the PNGs beside
it, written to ``<workspace>/sweeps/<name>/report/`` and logged as artifacts of the sweep's
parent run under ``report/``. Each figure appears when the sweep has the data for it:

    fig2_epochs_by_latent.png      validation token accuracy over epochs, a line per latent length
    fig3_accuracy_by_fraction.png  best accuracy against latent length as % of input, a line per input length
    seeds_bands.png, seeds_boxes.png   mean +- standard error and box plots over seeds, per epoch
    summary.png                    above MANY trials: accuracy over epochs as percentile bands, and
                                   each trial's best accuracy against its cost as a hexbin
    losses.png                     train loss (per step where the trial logged its curve) and validation
                                   loss per trial (above MANY trials, of the DRAWN best)
    optuna_*.png                   optimization history, parameter importances, parallel
                                   coordinates (above MANY complete trials, of the MANY best), or
                                   the Pareto front of a multi-objective sweep
    front.png                      with two objectives: the front chosen on validation, drawn with
                                   its test scores, beside the published grid's front where
                                   benchmarks/tables/frontier.parquet has the sweep's input length;
                                   and the front's hypervolume against the resource-seconds spent
                                   (its numbers in front.json)

Then a table of every trial, failed and running ones included (sortable, searchable, a page of
100 rows at a time), and validation samples
at each latent ratio with the reconstruction's wrong tokens highlighted. The page's HTML, CSS
and sort script are the Jinja2 templates in ``dashboards/templates``; this module passes them data.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import statistics
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import matplotlib
import optuna
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from mlflow.tracking import MlflowClient
from optuna.visualization import matplotlib as ovm

from seqae_core import names as N
from seqae_core.pareto import hypervolume, ranks

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter  # noqa: E402

from dashboards import claims  # noqa: E402
from sweeps.mlflow_runs import all_runs  # noqa: E402
from seqae_core import metrics as M  # noqa: E402
from seqae_core.config import parse_scalar  # noqa: E402
from sweeps.spec import Objective, SweepSpec  # noqa: E402
from sweeps.workspace import SweepState  # noqa: E402

log = logging.getLogger(__name__)

# Optuna's trial states, as runs closed before the seqae.outcome tag recorded them
LEGACY_STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "interrupted"}
CURVES = (M.VAL_TOKEN_ACCURACY, M.TRAIN_LOSS, M.VAL_LOSS, M.TRAIN_LOSS_STEPS, M.GLOBAL_STEP)
# Above this many trials a line per trial is a smear: the figures summarize all of them (percentile
# bands, a hexbin) and draw lines for the best DRAWN only, whose other curves alone are read.
MANY = 50
DRAWN = 12

# The published compression frontier (benchmarks/frontier.py): a grid at 16-128 input tokens on 30
# pages of the offline corpus; absent from an installed package, where the report draws no overlay.
GRID_FRONTIER = Path(__file__).resolve().parents[1] / "benchmarks" / "tables" / "frontier.parquet"
GRID_PARTS = ("fig3", "width")  # its grid's trainings (the others: a sweep, and a cell trained again)

# Autoescape is on for the .html templates: every value is text, escaped where it is rendered.
TEMPLATES = Environment(loader=PackageLoader("dashboards"), autoescape=select_autoescape(["html"]),
                        undefined=StrictUndefined)


@dataclass
class Trial:
    number: int
    run_id: str
    status: str  # the MLflow run's status
    state: str  # COMPLETE, PRUNED, FAIL or RUNNING
    params: dict[str, Any]
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    duration: float = 0.0
    node: str = ""
    samples: list[dict[str, list[str]]] = field(default_factory=list)
    cost: float | None = None  # resource-seconds: training wall time x the CPUs or GPU fraction held
    resource: str = "cpu"
    test: float | None = None  # the kept checkpoint's test token accuracy (pages nothing selected on)
    start: str | None = None  # the starting point it is, by name
    # with train.repeats > 1: each seed's value and the standard error of the token accuracies, at the kept epoch
    spread: dict[str, float] = field(default_factory=dict)
    logged: set[str] = field(default_factory=lambda: set(CURVES))  # the metrics its run logged
    samples_logged: bool = False  # its run holds best-model artifacts (samples.json): load_samples reads them

    @property
    def input_len(self) -> int:
        return int(self.params.get("data.input_len", 0))

    @property
    def latent_len(self) -> int:
        return int(self.params.get("model.latent_len", 0))

    @property
    def fraction(self) -> float:
        return self.latent_len / self.input_len if self.input_len else 0.0

    @property
    def accuracy(self) -> list[tuple[int, float]]:
        return self.curves.get(M.VAL_TOKEN_ACCURACY, [])

    @property
    def best(self) -> float | None:
        return max((v for _, v in self.accuracy), default=None)

    @property
    def kept_epoch(self) -> int | None:
        """The epoch early stopping kept: the first of the best validation accuracy."""
        return max(self.accuracy, key=lambda point: (point[1], -point[0]))[0] if self.accuracy else None

    @property
    def epochs(self) -> int:
        return len(self.accuracy)

    @property
    def stopped_early(self) -> bool:
        """Stopped by the scheduler (pruned), or by early stopping before its last epoch."""
        return self.state == "pruned" or (self.state == "complete" and self.epochs < int(self.params.get("train.epochs", 0)))


def collect(tracking_uri: str, experiment_id: str) -> tuple[Any, list[Trial]]:
    """The parent run and every child run of a sweep, with their validation accuracy over epochs
    (the other curves: :func:`load_curves`, for the trials a figure draws one by one)."""
    client = MlflowClient(tracking_uri)
    found = list(all_runs(client, experiment_id))
    parent = next((r for r in found if r.data.tags.get(N.ROLE) == N.ROLE_SWEEP), None)
    trials = []
    now = time.time() * 1000
    for run in found:
        tags = run.data.tags
        if N.TRIAL not in tags:
            continue
        # set whenever the sweep closes the run (runs closed before the tag existed carry Optuna's state)
        state = tags.get(N.OUTCOME) or LEGACY_STATES.get(tags.get("optuna.state", ""), "running")
        if run.info.status == "RUNNING":
            state = "running"
        trial = Trial(
            number=int(tags[N.TRIAL]), run_id=run.info.run_id, status=run.info.status, state=state,
            params={k: parse_scalar(v) for k, v in run.data.params.items()},
            duration=((run.info.end_time or now) - run.info.start_time) / 1000,
            node=tags.get("ray.node_ip", "") + (f" ({tags['ray.node_id'][:8]})" if "ray.node_id" in tags else ""),
            cost=run.data.metrics.get(M.RESOURCE_SECONDS), resource=tags.get(N.RESOURCE, "cpu"),
            test=run.data.metrics.get(M.TEST_TOKEN_ACCURACY), start=tags.get(N.START),
            logged=set(run.data.metrics), samples_logged=bool(tags.get(N.ARTIFACTS_EPOCH)),
        )
        load_curves(client, [trial], (M.VAL_TOKEN_ACCURACY,))
        for key in run.data.metrics:
            if M.is_spread(key) and M.base_metric(key) in (M.VAL_TOKEN_ACCURACY, M.TEST_TOKEN_ACCURACY):
                trial.spread[key] = next((m.value for m in client.get_metric_history(run.info.run_id, key)
                                          if m.step == trial.kept_epoch), run.data.metrics[key])
        trials.append(trial)
    return parent, sorted(trials, key=lambda t: t.number)


def load_curves(client: MlflowClient, trials: list[Trial], keys: tuple[str, ...] = CURVES) -> None:
    """Read the metric histories ``keys`` of ``trials`` that they logged and have not read yet: a
    call per trial and metric, so a large sweep's are read only for the trials drawn one by one."""
    for trial in trials:
        for key in keys:
            if key in trial.logged and key not in trial.curves:
                trial.curves[key] = sorted((m.step, m.value) for m in client.get_metric_history(trial.run_id, key))


def load_samples(client: MlflowClient, trial: Trial) -> list[dict[str, list[str]]]:
    """The validation samples the trial's best-model artifacts hold (empty if they are missing)."""
    if not trial.samples and trial.samples_logged:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                trial.samples = json.loads(Path(client.download_artifacts(trial.run_id, "samples.json", tmp))
                                           .read_text())
            except Exception:  # noqa: BLE001 - a missing artifact only drops the samples
                log.warning("no samples for trial %d", trial.number)
    return trial.samples


# -- figures ---------------------------------------------------------------------------------
def epoch_axis(ax: Any) -> None:
    """An x axis of epochs, ticked at whole epochs only."""
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def save_figure(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _by_epoch(trials: list[Trial], key: str = M.VAL_TOKEN_ACCURACY) -> dict[int, list[float]]:
    """Each epoch's values of ``key`` over ``trials``, in epoch order."""
    by_epoch: dict[int, list[float]] = defaultdict(list)
    for trial in trials:
        for step, value in trial.curves.get(key, []):
            by_epoch[step].append(value)
    return dict(sorted(by_epoch.items()))


def fig2(trials: list[Trial], out: Path) -> Path | None:
    """Accuracy over epochs, a line per latent length, at the input length with most latents."""
    latents: dict[int, set[int]] = defaultdict(set)
    for t in trials:
        if t.accuracy:
            latents[t.input_len].add(t.latent_len)
    if not latents or max(len(v) for v in latents.values()) < 2:
        return None
    input_len = max(latents, key=lambda n: (len(latents[n]), n))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for latent in sorted(latents[input_len], reverse=True):
        group = [t for t in trials if t.input_len == input_len and t.latent_len == latent and t.accuracy]
        by_epoch = _by_epoch(group)
        ax.plot(list(by_epoch), [statistics.fmean(v) for v in by_epoch.values()], marker="o",
                label=f"{input_len}to{latent}")
    for pct, acc, text in claims.PAPER_512:  # the paper's final values at these fractions of 512 tokens
        if any(abs(100 * latent / input_len - pct) < 1e-6 for latent in latents[input_len]):
            ax.axhline(acc, color="black", linestyle=":", linewidth=1)
            ax.annotate(f"paper: {text}", (0, acc), xycoords=("axes fraction", "data"), xytext=(4, 3),
                        textcoords="offset points", fontsize=7)
    ax.set(ylabel="validation token accuracy", title=f"Accuracy over epochs at input length {input_len} (cf. paper Fig. 2)")
    epoch_axis(ax)
    ax.grid(alpha=0.3)
    ax.legend(title="input to latent", fontsize=8)
    return save_figure(fig, out / "fig2_epochs_by_latent.png")


def by_fraction(scored: Iterable[tuple[Trial, float]]) -> claims.Points:
    """``(trial, value)`` pairs as Fig. 3's points: per input length, the mean value at each latent
    fraction (% of the input), in fraction order."""
    points: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t, value in scored:
        points[t.input_len][round(100 * t.fraction, 2)].append(value)
    return {n: sorted((f, sum(v) / len(v)) for f, v in by_f.items()) for n, by_f in points.items()}


def fig3(trials: list[Trial], out: Path) -> tuple[Path | None, dict[int, list[tuple[float, float]]]]:
    """Best accuracy against the latent fraction, a line per input length; also returns the points."""
    series = by_fraction((t, t.best) for t in trials if t.best is not None and t.state in ("complete", "pruned"))
    if not series or max(len(s) for s in series.values()) < 2:
        return None, series
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for input_len in sorted(series):
        xs, ys = zip(*series[input_len])
        ax.plot(xs, ys, marker="o", label=str(input_len))
    ax.plot([p for p, _, _ in claims.PAPER_512], [a for _, a, _ in claims.PAPER_512], marker="*", markersize=12,
            color="black", linestyle="none", label="paper, 512 (its text)")
    ax.set(xlabel="latent length, % of input length", ylabel="best validation token accuracy",
           title="Accuracy against reduction (cf. paper Fig. 3)")
    ax.grid(alpha=0.3)
    ax.legend(title="input length")
    return save_figure(fig, out / "fig3_accuracy_by_fraction.png"), series


def seed_groups(trials: list[Trial]) -> dict[str, list[Trial]]:
    """Trials that differ only in ``train.seed``, for groups of at least two seeds."""
    groups: dict[str, list[Trial]] = defaultdict(list)
    for t in trials:
        if t.accuracy and "train.seed" in t.params:
            key = {k: v for k, v in t.params.items() if k != "train.seed"}
            label = f"{t.input_len}to{t.latent_len}, lr {key.get('train.lr')} {key.get('train.lr_schedule', '')}"
            groups[json.dumps(key, sort_keys=True) + "\0" + label].append(t)
    return {k.split("\0")[1]: v for k, v in groups.items() if len({t.params["train.seed"] for t in v}) >= 2}


def seeds_figures(trials: list[Trial], out: Path) -> list[Path]:
    groups = seed_groups(trials)
    if not groups:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, group in groups.items():
        by_epoch = _by_epoch(group)
        epochs, mean = list(by_epoch), [statistics.fmean(v) for v in by_epoch.values()]
        se = [statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else 0.0 for v in by_epoch.values()]
        ax.plot(epochs, mean, linewidth=2, label=f"{label} ({len(group)} seeds)")
        ax.fill_between(epochs, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)], alpha=0.25)
    ax.set(ylabel="validation token accuracy", title="Mean and standard error over seeds (cf. paper Fig. 4)")
    epoch_axis(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    paths = [save_figure(fig, out / "seeds_bands.png")]
    fig, axes = plt.subplots(len(groups), 1, figsize=(7, 3 * len(groups)), squeeze=False)
    for ax, (label, group) in zip(axes[:, 0], groups.items()):
        by_epoch = _by_epoch(group)
        ax.boxplot(list(by_epoch.values()), positions=list(by_epoch), widths=0.6)
        ax.set(xlabel="epoch", ylabel="accuracy", title=f"{label}: spread over {len(group)} seeds (cf. paper Fig. 5)")
        ax.grid(alpha=0.3)
    paths.append(save_figure(fig, out / "seeds_boxes.png"))
    return paths


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


def grid_data(trials: list[Trial], grid: dict[str, tuple[Any, ...]]) -> dict[str, Any] | None:
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

    return {"caption": f"best val_token_accuracy; columns: {', '.join(col_keys)}", "cols": list(cols),
            "rows": [{"label": label(row), "cells": [mean(cells.get((c, row))) for c in cols]} for row in rows]}


def _claims(verdicts: list[claims.Verdict]) -> list[dict[str, Any]]:
    """A row per claim, classed by its verdict (``not-reproduced``) for the row's colour."""
    return [{"css": v.verdict.replace(" ", "-"), "cells": [v.claim, v.text, v.measured, v.verdict]} for v in verdicts]


def step_curve(trial: Trial) -> list[tuple[float, float]]:
    """The trial's training-loss curve (``train_loss_steps``, logged at global steps) against
    epochs, fractional between the steps each epoch ended at (``global_step``); empty without one."""
    points, ends = trial.curves.get(M.TRAIN_LOSS_STEPS), trial.curves.get(M.GLOBAL_STEP)
    if not points or not ends:
        return []
    epochs, last_steps = zip(*ends)
    x = np.interp([step for step, _ in points], (0, *last_steps), (0, *epochs))
    return [(float(e), value) for e, (_, value) in zip(x, points)]


def drawn(trials: list[Trial]) -> list[Trial]:
    """The trials the figures draw one by one: all of a small sweep's, a large one's best ``DRAWN``."""
    if len(trials) <= MANY:
        return trials
    return sorted((t for t in trials if t.best is not None), key=lambda t: -(t.best or 0.0))[:DRAWN]


def summary_figure(trials: list[Trial], out: Path) -> Path | None:
    """For a sweep of more than ``MANY`` trials: validation accuracy over epochs as the median and
    the 10-90% and 25-75% bands over the trials that reached each epoch; and each trial's best
    accuracy against its cost, as a hexbin (darker: more trials)."""
    by_epoch = _by_epoch(trials)
    if len(trials) <= MANY or not by_epoch:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    epochs = list(by_epoch)
    q = np.array([np.percentile(v, [10, 25, 50, 75, 90]) for v in by_epoch.values()])
    left.fill_between(epochs, q[:, 0], q[:, 4], alpha=0.2, color="C0", label="10-90%")
    left.fill_between(epochs, q[:, 1], q[:, 3], alpha=0.35, color="C0", label="25-75%")
    left.plot(epochs, q[:, 2], color="C0", marker="o", label="median")
    for epoch, values in by_epoch.items():
        left.annotate(str(len(values)), (epoch, q[epochs.index(epoch), 0]), xytext=(0, -10),
                      textcoords="offset points", fontsize=7, ha="center", color="#555")
    left.set(ylabel="validation token accuracy", title=f"Accuracy over epochs, {len(trials)} trials (n per epoch)")
    epoch_axis(left)
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    costed = [(t.cost, t.best) for t in trials if t.cost and t.best is not None]
    if costed:
        x, y = zip(*costed)
        cells = right.hexbin(x, y, gridsize=40, mincnt=1, cmap="Blues", bins="log")
        fig.colorbar(cells, ax=right, label="trials")
    unit = trials[0].resource
    right.set(xlabel=f"cost ({unit}-seconds)", ylabel="best validation token accuracy",
              title="Best accuracy against cost, per trial")
    right.grid(alpha=0.3)
    return save_figure(fig, out / "summary.png")


def losses(trials: list[Trial], out: Path) -> Path | None:
    """Train loss (its per-step curve where logged, else each epoch's mean) and validation loss."""
    with_data = [t for t in trials if t.curves.get(M.TRAIN_LOSS)]
    if not with_data:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True, sharey=True)
    for t in with_data:
        curve = step_curve(t)
        x, y = zip(*(curve or t.curves[M.TRAIN_LOSS]))
        (line,) = axes[0].plot(x, y, marker="" if curve else ".", linewidth=1 if curve else 1.5, label=f"trial {t.number}")
        if t.curves.get(M.VAL_LOSS):
            axes[1].plot(*zip(*t.curves[M.VAL_LOSS]), marker=".", color=line.get_color(), label=f"trial {t.number}")
    for ax, title in zip(axes, ("train loss", "validation loss")):
        ax.set(title=title)
        epoch_axis(ax)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cross-entropy per token")
    if len(with_data) <= 12:
        axes[1].legend(fontsize=7)
    return save_figure(fig, out / "losses.png")


IMPORTANCE_TRIALS = 5


def optuna_figures(storage: str, study_name: str, out: Path) -> tuple[list[Path], list[str]]:
    """Optuna's own plots; returns the figures and notes on the ones the study cannot have yet."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    # (file, label, the completed trials it needs, how to draw it): fANOVA's forest fitted to fewer
    # than IMPORTANCE_TRIALS points ranks noise, and costs a scikit-learn import to say so
    plots = ([("optuna_pareto_front.png", "Pareto front", 2, lambda: ovm.plot_pareto_front(study))]
             if len(study.directions) > 1 else
             [("optuna_history.png", "optimization history", 2, lambda: ovm.plot_optimization_history(study)),
              ("optuna_importances.png", "parameter importances", IMPORTANCE_TRIALS,
               lambda: ovm.plot_param_importances(study)),
              ("optuna_parallel.png", "parallel coordinates", 2, lambda: ovm.plot_parallel_coordinate(best_of(study)))])
    paths, notes = [], []
    for file_name, label, needs, draw in plots:
        if len(complete) < needs:
            notes.append(f"Optuna {label}: needs {needs} completed trials, the study has {len(complete)}")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the matplotlib backend is marked experimental
                draw()
            fig = plt.gcf()  # Optuna draws into a new current figure
            fig.set_size_inches(8, 4.8)
            paths.append(save_figure(fig, out / file_name))
        except (ValueError, RuntimeError) as exc:  # e.g. importances when no parameter varies
            notes.append(f"Optuna {label}: {exc}")
            plt.close("all")
    return paths, notes


def on_test(trial: optuna.trial.FrozenTrial, metrics: list[str]) -> tuple[float, ...] | None:
    """The trial's objectives measured on the test pages: each ``val_x`` as ``test_x``, the others
    (a latent's size) as they are; None without a test score."""
    test = trial.user_attrs.get(N.TEST) or {}
    values = [test.get(m.replace("val_", "test_", 1)) if m.startswith("val_") else v
              for m, v in zip(metrics, trial.values or [])]
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


def front(trials: list[optuna.trial.FrozenTrial], metrics: list[str], modes: list[str], costs: dict[int, float],
          beside: list[tuple[float, ...]] | None = None) -> Front | None:
    """The :class:`Front` of ``trials`` (a study's), ``costs`` each trial's resource-seconds by
    number, the hypervolumes' reference also beyond the points ``beside`` (another front drawn with
    it, scored in the same box); None unless two objectives and a complete trial with a test score."""
    ended = sorted((t for t in trials if t.state.is_finished() and t.datetime_complete is not None),
                   key=lambda t: (t.datetime_complete, t.number))
    tested = {t.number: point for t in ended if t.state == optuna.trial.TrialState.COMPLETE and t.values
              and (point := on_test(t, metrics)) is not None}
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
    columns = {M.VAL_TOKEN_ACCURACY: ("val_token_accuracy", "test_token_accuracy"),
               M.LATENT_SHARE: ("float_share", "float_share")}
    if not path.exists() or sorted(metrics) != sorted(columns):
        return None
    table = pd.read_parquet(path)
    kept = table[table["part"].isin(GRID_PARTS) & (table["epoch"] == table["kept_epoch"])
                 & (table["trained_on"] == table["scored_on"]) & (table["input_len"] == input_len)]
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
    ax.plot(*_staircase(found.front, x, y), marker="o", drawstyle="steps-post" if found.modes[x] == "min" else "steps-pre",
            color="C0", label="the sweep's front (chosen on validation)")
    if grid:
        ax.plot(*_staircase(grid, x, y), marker="s", linestyle="--", drawstyle="steps-post", color="C3",
                label=f"the published grid's front, {input_len} tokens (benchmarks/tables/frontier.parquet)")
    if found.metrics[x] == M.LATENT_SHARE:
        ax.set_xscale("log", base=2)  # a tick at each halving of the latent
        ax.xaxis.set_major_formatter(FuncFormatter(lambda share, _: f"{100 * share:g}%"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel=label[x], ylabel=label[y], title="The front on the test pages (never selected on)")
    hv.plot(found.spent, found.validation, marker=".", drawstyle="steps-post", label="validation")
    hv.plot(found.spent, found.test, marker=".", drawstyle="steps-post", label="test")
    if grid:
        hv.axhline(hypervolume(grid, found.modes, found.reference), color="C3", linestyle="--",
                   label="the published grid's front, test")
    hv.set(xlabel=f"{unit}-seconds spent by the trials ended", ylabel="hypervolume",
           title="The front's hypervolume as trials ended")
    for a in (ax, hv):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    return save_figure(fig, out / "front.png")


@dataclass(frozen=True)
class Story:
    """What a sweep found, the report's first lines: read from its Optuna study, the record the
    search selected on, so it follows the sweep's objectives whatever they are."""

    found: list[str]  # the best trial (or the front), its validation and test scores, who proposed it
    starts: list[str]  # each starting point's trial, with the same scores
    proposed_by: str  # how many trials each proposer proposed
    cost: str  # what the trials spent, against the budget


def _scores(trial: optuna.trial.FrozenTrial, metrics: list[str]) -> str:
    """The trial's objectives on validation, and the same measures on test (``val_x``: ``test_x``)."""
    values = ", ".join(f"{m} {v:.4f}" for m, v in zip(metrics, trial.values or []))
    test = trial.user_attrs.get(N.TEST) or {}
    shown = ", ".join(f"{k} {test[k]:.4f}" for k in (m.replace("val_", "test_", 1) for m in metrics) if k in test)
    return f"{values} (validation, selected on)" + (f"; {shown} (test pages, never selected on)" if shown else
                                                  "; no test score (no test split)")


def story(storage: str, study_name: str, spec: SweepSpec, trials: list[Trial]) -> Story:
    """The story of the sweep of ``spec`` (its objectives and budget)."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    metrics = [o.metric for o in spec.objectives]
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE
                and N.FORKED not in t.user_attrs]
    if not complete:
        found = ["No trial has completed yet."]
    elif len(metrics) > 1:
        front = [t for t in study.best_trials if t in complete]
        found = [f"A front of {len(front)} trials on {' and '.join(metrics)}:"] + [
            f"trial {t.number}: {_scores(t, metrics)}" for t in sorted(front, key=lambda t: t.values[0])]
    else:
        sign = spec.objectives[0].sign
        best = min(complete, key=lambda t: (-sign * t.values[0], t.number))
        by = best.user_attrs.get(N.START) and f"starting point {best.user_attrs[N.START]}" or best.user_attrs.get(
            N.PROPOSED_BY, "unrecorded")
        found = [f"The best trial is {best.number} (proposed by {by}): {_scores(best, metrics)}."]
    starts = [f"Starting point {t.user_attrs[N.START]}: trial {t.number}, " + (
        _scores(t, metrics) if t.state == optuna.trial.TrialState.COMPLETE else t.state.name.lower())
        for t in study.get_trials(deepcopy=False) if N.START in t.user_attrs]
    proposers = Counter(t.user_attrs.get(N.PROPOSED_BY, "unrecorded") for t in study.get_trials(deepcopy=False)
                        if N.FORKED not in t.user_attrs)
    unit = trials[0].resource if trials else "cpu"
    spent = sum(t.cost or 0.0 for t in trials) / 3600
    budget = spec.budget.hours if spec.budget and spec.budget.unit == unit else None
    return Story(found, starts, ", ".join(f"{who} {n}" for who, n in proposers.items()) or "no trial yet",
                 f"{spent:.4f} {unit}-hours" + (f" of a budget of {budget:g}" if budget else ""))


def best_of(study: optuna.Study, n: int = MANY) -> optuna.Study:
    """The study itself, or for one of more than ``n`` complete trials an in-memory copy of its
    ``n`` best (a line per trial of thousands is a smear)."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) <= n or len(study.directions) > 1:
        return study
    sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
    top = optuna.create_study(directions=study.directions)
    if study.metric_names:
        top.set_metric_names(study.metric_names)
    top.add_trials(sorted(complete, key=lambda t: sign * t.values[0])[:n])
    return top


# -- the page: data for templates/report.html ------------------------------------------------
def embedded(path: Path, caption: str) -> dict[str, str]:
    """A figure embedded as base64 PNG data."""
    return {"caption": caption, "name": path.name, "data": base64.b64encode(path.read_bytes()).decode()}


def _varying(trials: list[Trial]) -> list[str]:
    keys = sorted({k for t in trials for k in t.params})
    return [k for k in keys if len({str(t.params.get(k)) for t in trials}) > 1]


def _short(value: Any) -> Any:
    return f"{value:.4g}" if isinstance(value, float) else value


def _table(trials: list[Trial]) -> dict[str, Any]:
    """The trials table: its column names and a row of cell texts per trial, classed by its state."""
    varying = _varying(trials)
    unit = trials[0].resource if trials else "cpu"
    tested = any(t.test is not None for t in trials)
    repeated = any(t.spread for t in trials)
    head = ["trial", "state", *varying, "best val accuracy (selected on)",
            *(["test accuracy (never selected on)"] if tested else []),
            *(["val accuracy per seed"] if repeated else []), "epochs", "stopped early", "duration (s)",
            f"cost ({unit}-s)", f"accuracy per {unit}-hour", "node"]
    rows = []
    for t in trials:
        cells = [f"{t.number} ({t.start})" if t.start else t.number, t.state,
                 *[_short(t.params.get(k, "")) for k in varying],
                 "" if t.best is None else M.value_text(t.best, t.spread, M.VAL_TOKEN_ACCURACY),
                 *(["" if t.test is None else M.value_text(t.test, t.spread, M.TEST_TOKEN_ACCURACY)] if tested else []),
                 *([M.seeds_text(t.spread, M.VAL_TOKEN_ACCURACY)] if repeated else []),
                 t.epochs, "yes" if t.stopped_early else "no",
                 f"{t.duration:.1f}", "" if t.cost is None else f"{t.cost:.1f}",
                 f"{3600 * t.best / t.cost:.1f}" if t.cost and t.best is not None else "", t.node]
        rows.append({"state": t.state, "cells": [str(c) for c in cells]})
    return {"head": head, "rows": rows}


def _samples(trials: list[Trial], load: Callable[[Trial], list[dict[str, list[str]]]],
             per_ratio: int = 2) -> list[dict[str, Any]]:
    """Per latent ratio, the best trial's first samples: the original tokens and (reconstructed,
    original) token pairs, which the template highlights where they differ. ``load`` reads a
    trial's samples: only the trials shown are read."""
    by_ratio: dict[tuple[int, int], list[Trial]] = defaultdict(list)
    for t in trials:
        if (t.samples or t.samples_logged) and t.input_len:  # a run without its parameters cannot be placed
            by_ratio[(t.input_len, t.latent_len)].append(t)
    blocks = []
    for (input_len, latent), group in sorted(by_ratio.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        best = max(group, key=lambda t: t.best or 0.0)
        samples = load(best)
        if not samples:
            continue
        pairs = [{"original": sample["original"], "tokens": list(zip(sample["reconstruction"], sample["original"]))}
                 for sample in samples[:per_ratio]]
        blocks.append({"heading": f"{input_len} to {latent} tokens ({100 * latent / input_len:.0f}%), trial {best.number}",
                       "pairs": pairs})
    return blocks


def template_digest() -> str:
    """The SHA-256 of the report's templates: the README's picture of a report records the digest
    it was taken with, and a test fails when the templates change without a new picture."""
    folder = Path(__file__).resolve().parent / "templates"
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _front(state: SweepState, trials: list[Trial], objectives: tuple[Objective, ...], out: Path) -> Path | None:
    study = optuna.load_study(study_name=state.study_name, storage=state.backends.optuna_storage)
    metrics, modes = [o.metric for o in objectives], [o.mode for o in objectives]
    lengths = {t.input_len for t in trials}
    input_len = lengths.pop() if len(lengths) == 1 else 0
    grid = grid_front(GRID_FRONTIER, input_len, metrics, modes)
    found = front(study.get_trials(deepcopy=False), metrics, modes, {t.number: t.cost or 0.0 for t in trials}, grid)
    if found is None:
        return None
    (out / "front.json").write_text(json.dumps({**asdict(found), "grid": grid}, indent=1))
    return front_figure(found, grid, input_len, trials[0].resource, out)


def build(state: SweepState, out: Path, log_to_mlflow: bool = True) -> Path:
    """Write the report of sweep ``state`` into the folder ``out`` and log it to the parent run."""
    backends = state.backends
    if not state.mlflow_experiment_id:
        raise ValueError(f"sweep {state.name!r} has not started yet: it has no MLflow runs")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    client = MlflowClient(backends.mlflow_tracking_uri)
    parent, trials = collect(backends.mlflow_tracking_uri, state.mlflow_experiment_id)
    load_curves(client, drawn(trials))
    figures: list[tuple[Path, str]] = []
    notes: list[str] = []
    if (path := fig2(trials, out)) is not None:
        figures.append((path, "Validation token accuracy over epochs, one line per latent length"))
    path, fig3_points = fig3(trials, out)
    if path is not None:
        figures.append((path, "Best accuracy against the latent length as a percentage of the input"))
    figures += [(p, "Accuracy over seeds, per epoch") for p in seeds_figures(trials, out)]
    if (path := summary_figure(trials, out)) is not None:
        figures.append((path, f"All {len(trials)} trials: accuracy over epochs (percentiles) and against cost"))
    shown = drawn(trials)
    if (path := losses(shown, out)) is not None:
        figures.append((path, "Train and validation loss per trial" if shown is trials else
                        f"Train and validation loss of the {len(shown)} best trials (of {len(trials)})"))
    try:
        paths, optuna_notes = optuna_figures(backends.optuna_storage, state.study_name, out)
        figures += [(p, p.stem.replace("_", " ")) for p in paths]
        notes += optuna_notes
    except Exception as exc:  # noqa: BLE001 - the study may be unreachable; the rest of the report stands
        notes.append(f"Optuna plots unavailable: {exc}")
    objectives = state.spec.objectives
    try:
        if len(objectives) == 2 and (path := _front(state, trials, objectives, out)) is not None:
            figures.append((path, "The front on test beside the published grid's, and its hypervolume against compute"))
    except Exception as exc:  # noqa: BLE001 - the study may be unreachable; the rest of the report stands
        notes.append(f"The front is unavailable: the Optuna study cannot be read ({exc})")
    (out / "fig3_points.json").write_text(json.dumps({str(k): v for k, v in fig3_points.items()}, indent=1))
    verdicts = claims.check(test_points(trials), seed_spreads(trials), claims.not_studied(state.spec))
    (out / "claims.json").write_text(json.dumps([v.__dict__ for v in verdicts], indent=1))
    tested = [v for v in verdicts if v.verdict != claims.NOT_TESTED]
    try:
        told: Story | None = story(backends.optuna_storage, state.study_name, state.spec, trials)
    except Exception as exc:  # noqa: BLE001 - the study may be unreachable; the rest of the report stands
        told = None
        notes.append(f"What the sweep found is unavailable: the Optuna study cannot be read ({exc})")

    counts = Counter(t.state for t in trials)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials yet"
    page = TEMPLATES.get_template("report.html").render(
        name=state.name, done=len(trials), total=state.total_trials, summary=summary,
        built=time.strftime("%Y-%m-%d %H:%M:%S"), experiment_id=str(state.mlflow_experiment_id),
        parent_run_id=parent.info.run_id if parent else "-", story=told, claims=_claims(tested),
        untested=", ".join(v.claim for v in verdicts if v.verdict == claims.NOT_TESTED),
        figures=[embedded(p, c) for p, c in figures], notes=notes, grid=grid_data(trials, state.spec.grid),
        trials=_table(trials), samples=_samples(trials, partial(load_samples, client)))
    index = out / "index.html"
    index.write_text(page)
    if log_to_mlflow and parent is not None:
        client.log_artifacts(parent.info.run_id, str(out), artifact_path="report")
    return index
