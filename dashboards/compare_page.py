"""``seqae sweep compare``'s page: several sweeps of one objective side by side, in the report's
style. Its figures: the best value so far against the resource-seconds spent (the currency a
sweep is paid in), and each sweep's best trial's validation curve. One self-contained HTML file
with the PNGs beside it; the sweep service passes plain data (:class:`Compared`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt

from dashboards.report.figures import epoch_axis, save_figure
from dashboards.report.page import TEMPLATES, embedded


@dataclass(frozen=True)
class Compared:
    name: str
    cells: dict[str, str]  # the comparison table's row: column -> text
    spent: list[tuple[float, float]]  # at each finished trial, in the order they ended: (resource-seconds, best so far)
    curve: list[tuple[float, float]]  # the best trial's validation accuracy at each validation: (epochs trained, value)
    unit: str  # "cpu" or "gpu"


def _best_so_far(sweeps: list[Compared], metric: str, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for sweep in sweeps:
        if sweep.spent:
            ax.step(
                [s for s, _ in sweep.spent], [v for _, v in sweep.spent], where="post", marker="o", label=sweep.name
            )
    ax.set(
        xlabel=f"{sweeps[0].unit}-seconds spent",
        ylabel=f"best {metric} so far",
        title="What each sweep found for what it spent",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out / "best_so_far.png")


def _curves(sweeps: list[Compared], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for sweep in sweeps:
        if sweep.curve:
            ax.plot([e for e, _ in sweep.curve], [v for _, v in sweep.curve], marker="o", label=sweep.name)
    ax.set(ylabel="validation token accuracy", title="Each sweep's best trial, epoch by epoch")
    epoch_axis(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out / "best_curves.png")


def build(sweeps: list[Compared], metric: str, out: Path) -> Path:
    """Write the comparison page and its figures to ``out``; returns the page."""
    out.mkdir(parents=True, exist_ok=True)
    figures = [
        (_best_so_far(sweeps, metric, out), f"best {metric} so far against resource-seconds spent"),
        (_curves(sweeps, out), "the best trial's validation accuracy per epoch"),
    ]
    head = list(sweeps[0].cells)
    page = TEMPLATES.get_template("compare.html").render(
        names=", ".join(s.name for s in sweeps),
        built=time.strftime("%Y-%m-%d %H:%M:%S"),
        head=head,
        rows=[[s.cells[c] for c in head] for s in sweeps],
        figures=[embedded(p, c) for p, c in figures],
    )
    index = out / "index.html"
    index.write_text(page)
    return index
