"""How well a trial's ranking at an early epoch predicts its final one: the evidence for ASHA's rungs.

One real `seqae sweep run` over the quickstart's space (``sweeps/studies/quickstart.yaml``), with
random proposals, no starting point, no scheduler and a patience as long as the run, so every trial
trains every epoch. For each epoch e: Kendall's tau between the trials' validation accuracy at e
and their final objective (the best validation accuracy over all epochs), and what ASHA with
reduction factor 3 would have lost deciding there: whether the final best trial is among the top
third at e, and the regret (the final best's objective minus that of the trial that led at e).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from scipy.stats import kendalltau

from research import command
from research.sweep_runs import sweep_events
from seqae_core.borders import Document

QUICKSTART = Path(__file__).resolve().parent.parent / "sweeps" / "studies" / "quickstart.yaml"


def _document(data_path: str, epochs: int, trials: int, seed: int) -> Document:
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["config"]["data"]["path"] = data_path
    doc["config"]["train"].update(epochs=epochs, patience=epochs)
    doc.update(
        trials={"total": trials},
        sampler={"type": "random", "seed": seed},
        start={},
        scheduler={"type": "none"},
        description="rung-agreement benchmark: every trial to the end",
    )
    return doc


def agreement(curves: dict[int, list[float]], reduction_factor: int = 3) -> list[command.Row]:
    """Per epoch, how the trials' ranking there agrees with their final objective (``curves``:
    each trial's validation accuracy per epoch, all of the same length)."""
    trials = sorted(curves)
    final = [max(curves[t]) for t in trials]
    best = max(final)
    keep = max(1, len(trials) // reduction_factor)
    rows: list[command.Row] = []
    for epoch in range(1, len(curves[trials[0]]) + 1):
        at = [curves[t][epoch - 1] for t in trials]
        tau, p = kendalltau(at, final)
        kept = sorted(range(len(trials)), key=lambda i: at[i], reverse=True)[:keep]
        rows.append(
            {
                "epoch": epoch,
                "trials": len(trials),
                "kendall_tau": round(float(tau), 3),
                "p_value": float(f"{p:.2g}"),
                f"best_in_top_1/{reduction_factor}": any(final[i] == best for i in kept),
                "regret_of_leader": round(best - final[kept[0]], 4),
            }
        )
    return rows


def run(data_path: str, trials: int = 24, epochs: int = 9, seed: int = 0) -> list[command.Row]:
    with tempfile.TemporaryDirectory() as tmp:
        events = sweep_events(Path(tmp), "rungs", _document(data_path, epochs, trials, seed))
    curves: dict[int, list[float]] = {}
    for _, trial, _, accuracy in events:
        curves.setdefault(trial, []).append(accuracy)
    complete = {t: c for t, c in curves.items() if len(c) == epochs}
    if len(complete) < len(curves):
        raise RuntimeError(f"{len(curves) - len(complete)} trials did not train all {epochs} epochs")
    return agreement(complete)


def main(argv: list[str] | None = None) -> None:
    args = command.parser("rung_agreement", __doc__, "data").parse_args(argv)
    command.show(run(command.data(args)), args.out)


if __name__ == "__main__":
    command.main(main)
