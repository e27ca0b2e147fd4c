"""The report's matplotlib figures of a sweep's trials: Fig. 2 (accuracy over epochs by latent
length), Fig. 3 (best accuracy by latent fraction), the seeds' bands and boxes, a large sweep's
summary and the loss curves; and which trials the figures draw one by one (:func:`drawn`)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from dashboards import claims
from dashboards.report.data import Trial
from dashboards.report.groups import by_fraction, seed_groups
from seqae_core import metrics as M

# Above this many trials a line per trial is a smear: the figures summarize all of them (percentile
# bands, a hexbin) and draw lines for the best DRAWN only, whose other curves alone are read.
MANY = 50
DRAWN = 12


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
        ax.plot(
            list(by_epoch), [statistics.fmean(v) for v in by_epoch.values()], marker="o", label=f"{input_len}to{latent}"
        )
    for pct, acc, text in claims.PAPER_512:  # the paper's final values at these fractions of 512 tokens
        if any(abs(100 * latent / input_len - pct) < 1e-6 for latent in latents[input_len]):
            ax.axhline(acc, color="black", linestyle=":", linewidth=1)
            ax.annotate(
                f"paper: {text}",
                (0, acc),
                xycoords=("axes fraction", "data"),
                xytext=(4, 3),
                textcoords="offset points",
                fontsize=7,
            )
    ax.set(
        ylabel="validation token accuracy", title=f"Accuracy over epochs at input length {input_len} (cf. paper Fig. 2)"
    )
    epoch_axis(ax)
    ax.grid(alpha=0.3)
    ax.legend(title="input to latent", fontsize=8)
    return save_figure(fig, out / "fig2_epochs_by_latent.png")


def fig3(trials: list[Trial], out: Path) -> tuple[Path | None, dict[int, list[tuple[float, float]]]]:
    """Best accuracy against the latent fraction, a line per input length; also returns the points."""
    series = by_fraction((t, t.best) for t in trials if t.best is not None and t.state in ("complete", "pruned"))
    if not series or max(len(s) for s in series.values()) < 2:
        return None, series
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for input_len in sorted(series):
        xs, ys = zip(*series[input_len])
        ax.plot(xs, ys, marker="o", label=str(input_len))
    ax.plot(
        [p for p, _, _ in claims.PAPER_512],
        [a for _, a, _ in claims.PAPER_512],
        marker="*",
        markersize=12,
        color="black",
        linestyle="none",
        label="paper, 512 (its text)",
    )
    ax.set(
        xlabel="latent length, % of input length",
        ylabel="best validation token accuracy",
        title="Accuracy against reduction (cf. paper Fig. 3)",
    )
    ax.grid(alpha=0.3)
    ax.legend(title="input length")
    return save_figure(fig, out / "fig3_accuracy_by_fraction.png"), series


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
        left.annotate(
            str(len(values)),
            (epoch, q[epochs.index(epoch), 0]),
            xytext=(0, -10),
            textcoords="offset points",
            fontsize=7,
            ha="center",
            color="#555",
        )
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
    right.set(
        xlabel=f"cost ({unit}-seconds)",
        ylabel="best validation token accuracy",
        title="Best accuracy against cost, per trial",
    )
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
        (line,) = axes[0].plot(
            x, y, marker="" if curve else ".", linewidth=1 if curve else 1.5, label=f"trial {t.number}"
        )
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
