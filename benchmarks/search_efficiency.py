"""How many trial-epochs a strategy spends before some trial reaches a target validation accuracy,
at one fixed cell (32 -> 8 tokens: a 25% latent), over the same space (lr x d_model x layers):

    grid        the paper's approach: every point of the grid, each trained to the end;
                its order is the only thing a seed changes
    random      Optuna's random sampler, every trial trained to the end
    asha+tpe    Optuna's TPE with Ray Tune's ASHA stopping poor trials early

Every strategy runs through the real `seqae sweep run`. The grid's own run fixes the target: the
accuracy that its best quarter of configurations reaches. A run's cost is the number of epochs
trained, over all its trials in the order their results arrived, until the first epoch at or
above the target.
"""

from __future__ import annotations

import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.sweep_runs import sweep_events
from seqae_core import metrics as M

LRS = [1e-3, 3e-3, 1e-2]
D_MODELS = [16, 32, 64]
LAYERS = [1, 2]


def _document(data_path: str, epochs: int, strategy: str, seed: int, trials: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "description": f"search-efficiency benchmark: {strategy}",
        "config": {
            "data": {"path": data_path, "samples": "windows", "input_len": 32, "max_pages": 8},
            "model": {"block": "transformer", "latent_len": 8, "d_attn": 32, "heads": 4, "d_ffn": 64},
            "train": {"epochs": epochs, "patience": epochs, "batch_size": 32, "lr_schedule": "constant",
                      "precision": "bf16"},
        },
        "objective": {"metric": M.VAL_TOKEN_ACCURACY, "mode": "max"},
        "resources": {"cpu": 1, "gpu": 0},
        "max_concurrent": 2,
    }
    if strategy == "grid":
        doc["grid"] = {"train.lr": LRS, "model.d_model": D_MODELS, "model.layers": LAYERS}
        doc["trials"] = {"per_cell": 1}
    else:
        doc["search"] = {
            "train.lr": {"type": "loguniform", "low": min(LRS), "high": max(LRS)},
            "model.d_model": {"type": "categorical", "choices": D_MODELS},
            "model.layers": {"type": "int", "low": min(LAYERS), "high": max(LAYERS)},
        }
        doc["trials"] = {"total": trials}
        doc["sampler"] = {"type": "random" if strategy == "random" else "tpe", "seed": seed}
        if strategy == "asha+tpe":
            doc["scheduler"] = {"type": "asha", "grace_period": 1, "reduction_factor": 3}
    return doc


def _epochs_to_target(events: list[tuple[float, int, int, float]], target: float) -> tuple[int, bool]:
    for spent, (_, _, _, accuracy) in enumerate(events, 1):
        if accuracy >= target:
            return spent, True
    return len(events), False


def _grid_in_order(curves: dict[int, list[float]], order: list[int], target: float) -> int:
    """Epochs the grid spends, running its points one after another in ``order``."""
    spent = 0
    for trial in order:
        for accuracy in curves[trial]:
            spent += 1
            if accuracy >= target:
                return spent
    return spent


def run(data_path: str, seeds: int = 3, epochs: int = 3, trials: int = 12) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        grid_events = sweep_events(folder, "grid", _document(data_path, epochs, "grid", 0, trials))
        curves: dict[int, list[float]] = {}
        for _, trial, _, accuracy in grid_events:
            curves.setdefault(trial, []).append(accuracy)
        finals = sorted((max(c) for c in curves.values()), reverse=True)
        target = finals[max(0, len(finals) // 4 - 1)]  # what the grid's best quarter reaches
        costs: dict[str, list[tuple[int, bool]]] = {"grid": [], "random": [], "asha+tpe": []}
        for seed in range(seeds):
            order = list(curves)
            random.Random(seed).shuffle(order)
            costs["grid"].append((_grid_in_order(curves, order, target), True))
            for strategy in ("random", "asha+tpe"):
                name = f"{strategy.replace('+', '-')}-{seed}"
                events = sweep_events(folder, name, _document(data_path, epochs, strategy, seed, trials))
                costs[strategy].append(_epochs_to_target(events, target))
    grid_mean = statistics.mean(c for c, _ in costs["grid"])
    rows = []
    for strategy, results in costs.items():
        spent = [c for c, _ in results]
        rows.append({
            "strategy": strategy, "target_accuracy": round(target, 4), "seeds": len(results),
            "trial_epochs_mean": round(statistics.mean(spent), 1),
            "trial_epochs_sd": round(statistics.stdev(spent), 1) if len(spent) > 1 else 0.0,
            "per_seed": spent, "reached": sum(ok for _, ok in results),
            "vs_grid": round(statistics.mean(spent) / grid_mean, 2),
            "grid_total_epochs": sum(len(c) for c in curves.values()),
        })
    return rows
