"""The paper's recipe against an Optuna search of the same budget, at laptop scale.

At each of 50%, 25% and 12.5% latent (32 -> 16, 8 and 4 tokens on the offline corpus):

    paper     the paper's hyperparameters (its block with the residual the laptop studies need,
              one head, lr 1e-3 -> 1e-4, batch 16; the laptop profiles' halved widths), trained
              from several seeds
    search    TPE with ASHA over the block, lr, widths, heads, layers, reduction and dropout,
              spending at most the trial-epochs the paper arm spends at that fraction
    best      the search's best configuration, trained from the paper arm's seeds

Every arm runs through the real ``seqae sweep run``. Both evaluated arms use the same seeds (not
the search's own seed 0, whose result picked the winner), so their spreads compare directly.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import optuna

from benchmarks.sweep_runs import sweep_events
from seqae_core import metrics as M

FRACTIONS = (0.5, 0.25, 0.125)
INPUT_LEN = 32

PAPER = {  # the paper's Table I at the laptop profiles' scale
    "model.block": "paper", "model.residual": True, "model.d_model": 128, "model.d_attn": 256, "model.heads": 1,
    "model.layers": 1, "model.dropout": 0.0,
}

SPACE = {
    "model.block": {"type": "categorical", "choices": ["paper", "transformer"]},
    "train.lr": {"type": "loguniform", "low": 3.0e-4, "high": 1.0e-2},
    "model.d_model": {"type": "categorical", "choices": [64, 128, 256]},
    "model.d_attn": {"type": "categorical", "choices": [64, 128, 256]},
    "model.heads": {"type": "categorical", "choices": [1, 2, 4]},
    "model.layers": {"type": "int", "low": 1, "high": 2},
    "model.reduction": {"type": "categorical", "choices": ["gradual", "once"]},
    "model.dropout": {"type": "uniform", "low": 0.0, "high": 0.2},
}


def _base(data_path: str, epochs: int) -> dict[str, Any]:
    return {
        "config": {
            "data": {"path": data_path, "samples": "windows", "input_len": INPUT_LEN, "max_pages": 60,
                     "vocab": "corpus"},
            "model": {"residual": True, "d_ffn": 512},
            "train": {"epochs": epochs, "patience": epochs, "batch_size": 16, "lr": 1.0e-3, "lr_final": 1.0e-4,
                      "lr_schedule": "linear", "lr_decay_epochs": epochs, "precision": "auto"},
        },
        "objective": {"metric": M.VAL_TOKEN_ACCURACY, "mode": "max"},
        "resources": {"cpu": 1, "gpu": 0},
        "max_concurrent": 2,
    }


def _seeded(data_path: str, epochs: int, seeds: list[int], fixed: dict[str, Any], fractions: list[float]) -> dict:
    doc = _base(data_path, epochs)
    for key, value in fixed.items():
        section, name = key.split(".", 1)
        doc["config"][section][name] = value
    doc["description"] = "recipe benchmark: fixed hyperparameters, several seeds"
    doc["grid"] = {"model.latent_fraction": fractions, "train.seed": seeds}
    doc["trials"] = {"per_cell": 1}
    return doc


def _search(data_path: str, epochs: int, fraction: float, trials: int) -> dict[str, Any]:
    doc = _base(data_path, epochs)
    doc["description"] = f"recipe benchmark: TPE + ASHA at {fraction:.0%} latent"
    doc["config"]["model"]["latent_fraction"] = fraction
    doc["search"] = SPACE
    doc["trials"] = {"total": trials}
    doc["sampler"] = {"type": "tpe", "seed": 0}
    doc["scheduler"] = {"type": "asha", "grace_period": 1, "reduction_factor": 3}
    return doc


def _study(folder: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{folder / 'ws' / 'optuna.db'}")


def _values(study: optuna.Study, fraction: float) -> list[float]:
    """The final objective of every trial at ``fraction``, in seed order."""
    done = [t for t in study.trials if t.value is not None
            and t.params.get("model.latent_fraction", fraction) == fraction]
    return [t.value for t in sorted(done, key=lambda t: t.params["train.seed"])]  # type: ignore[misc]


def _short(config: dict[str, Any]) -> dict[str, Any]:
    """``{"model.d_model": 128}`` -> ``{"d_model": 128}``, floats rounded, for the table."""
    return {k.split(".", 1)[1]: (round(v, 5) if isinstance(v, float) else v) for k, v in config.items()}


def _spread(values: list[float]) -> dict[str, Any]:
    return {"mean": round(statistics.mean(values), 4),
            "sd": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
            "per_seed": [round(v, 4) for v in values]}


def run(data_path: str, seeds: int = 3, epochs: int = 3, search_trials: int = 6) -> list[dict[str, Any]]:
    seed_list = list(range(1, seeds + 1))
    budget = seeds * epochs
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sweep_events(folder, "paper", _seeded(data_path, epochs, seed_list, PAPER, list(FRACTIONS)))
        paper = _study(folder, "paper")
        for fraction in FRACTIONS:
            paper_values = _values(paper, fraction)
            name = f"search-{int(fraction * 1000)}"
            events = sweep_events(folder, name, _search(data_path, epochs, fraction, search_trials))
            study = _study(folder, name)
            best = study.best_trial.params
            if len(events) > budget:
                raise RuntimeError(f"the search at {fraction} spent {len(events)} trial-epochs, over the paper "
                                   f"arm's {budget}: lower --search-trials")
            rerun = f"best-{int(fraction * 1000)}"
            sweep_events(folder, rerun, _seeded(data_path, epochs, seed_list, best, [fraction]))
            best_values = _values(_study(folder, rerun), fraction)
            gain = statistics.mean(best_values) - statistics.mean(paper_values)
            rows.append({"latent": f"{INPUT_LEN}->{round(fraction * INPUT_LEN)}", "arm": "paper",
                         "trial_epochs": budget, **_spread(paper_values), "config": _short(PAPER)})
            rows.append({"latent": f"{INPUT_LEN}->{round(fraction * INPUT_LEN)}", "arm": "search best",
                         "trial_epochs": len(events), **_spread(best_values),
                         "gain_points": round(100 * gain, 1), "search_best_seed0": round(study.best_value, 4),
                         "config": _short(best)})
    return rows
