"""The transformer block's defaults against the paper's hyperparameters on the same block, at
32 -> 16 and 32 -> 8 tokens, on the offline corpus with two different splits and on a corpus of
another kind (installed packages' READMEs, see :mod:`benchmarks.corpora`): settings that only
fit one split of one corpus show it here."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import optuna

from benchmarks.corpora import package_descriptions
from benchmarks.search_efficiency import sweep_events
from seqae_core import metrics as M
from seqae_core.config import BLOCK_DEFAULTS, ModelConfig, TrainConfig

LATENTS = (16, 8)


def _paper_values() -> dict[str, Any]:
    """What the transformer block trained with before it had defaults of its own: the paper's."""
    return {key: getattr(ModelConfig if key.startswith("model.") else TrainConfig, key.split(".", 1)[1])
            for key in BLOCK_DEFAULTS["transformer"]}


def _document(corpora: list[list[Any]], epochs: int, fixed: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, dict[str, Any]] = {
        "data": {"samples": "windows", "input_len": 32, "max_pages": 60, "vocab": "corpus"},
        "model": {"block": "transformer"},
        "train": {"epochs": epochs, "patience": epochs, "lr_decay_epochs": epochs, "precision": "auto"},
    }
    for key, value in fixed.items():
        section, name = key.split(".", 1)
        config[section][name] = value
    return {
        "description": "transformer defaults benchmark", "config": config,
        "grid": {"data.path,data.split_seed": corpora, "model.latent_len": list(LATENTS)},
        "trials": {"per_cell": 1}, "objective": {"metric": M.VAL_TOKEN_ACCURACY, "mode": "max"},
        "resources": {"cpu": 1, "gpu": 0}, "max_concurrent": 2,
    }


def run(data_path: str, epochs: int = 6) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        packages = str(package_descriptions(folder / "packages"))
        corpora = [[data_path, 0], [data_path, 1], [packages, 0]]
        for arm, fixed in (("defaults", {}), ("paper values", _paper_values())):
            name = arm.replace(" ", "-")
            sweep_events(folder, name, _document(corpora, epochs, fixed))
            study = optuna.load_study(study_name=name, storage=f"sqlite:///{folder / 'ws' / 'optuna.db'}")
            for trial in sorted(study.trials, key=lambda t: t.number):
                path = trial.params["data.path"]
                rows.append({
                    "arm": arm, "corpus": "packages" if path == packages else "wikipedia-mini",
                    "split_seed": trial.params["data.split_seed"], "latent": f"32->{trial.params['model.latent_len']}",
                    "epochs": epochs, M.VAL_TOKEN_ACCURACY: round(trial.value, 4) if trial.value is not None else None,
                })
    return rows
