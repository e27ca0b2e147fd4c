"""The transformer block's defaults off the split they were found on.

They were chosen on split 0 of the offline corpus at 32 -> 8 tokens. Here, at 6 epochs:

    32 -> 8    the defaults on split 1 of the corpus; the defaults and the paper's values (the
               block's defaults before) on a corpus of another kind (installed packages' READMEs,
               see :mod:`research.corpora`)
    32 -> 16   the defaults on the second corpus

Settings that only fit one split of one corpus show it here.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import optuna

from research import command
from research.corpora import package_descriptions
from research.sweep_runs import sweep_events
from seqae_core import metrics as M
from seqae_core.borders import Document
from seqae_core.config import BLOCK_DEFAULTS, ModelConfig, TrainConfig

CHANGED = list(BLOCK_DEFAULTS["transformer"])  # the keys whose defaults the transformer block has of its own
PAPER = [getattr(ModelConfig if k.startswith("model.") else TrainConfig, k.split(".", 1)[1]) for k in CHANGED]


def _document(data_path: str, packages: str, epochs: int) -> Document:
    defaults = [BLOCK_DEFAULTS["transformer"][k] for k in CHANGED]
    cells = [
        [*defaults, data_path, 1, 8],
        [*defaults, packages, 0, 8],
        [*PAPER, packages, 0, 8],
        [*defaults, packages, 0, 16],
    ]
    return {
        "description": "transformer defaults benchmark",
        "config": {
            "data": {"samples": "windows", "input_len": 32, "vocab": "corpus"},
            "model": {"block": "transformer"},
            "train": {"epochs": epochs, "patience": epochs, "lr_decay_epochs": epochs, "precision": "auto"},
        },
        "grid": {",".join([*CHANGED, "data.path", "data.split_seed", "model.latent_len"]): cells},
        "trials": {"per_cell": 1},
        "objective": {"metric": M.VAL_TOKEN_ACCURACY, "mode": "max"},
        "resources": {"cpu": 1, "gpu": 0},
        "max_concurrent": 2,
    }


def run(data_path: str, epochs: int = 6) -> list[command.Row]:
    rows: list[command.Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        packages = str(package_descriptions(folder / "packages"))
        sweep_events(folder, "defaults", _document(data_path, packages, epochs))
        study = optuna.load_study(study_name="defaults", storage=f"sqlite:///{folder / 'ws' / 'optuna.db'}")
        for trial in sorted(study.trials, key=lambda t: t.number):
            values = [trial.params[k] for k in CHANGED]
            rows.append(
                {
                    "arm": "defaults" if values != PAPER else "paper values",
                    **{k.split(".", 1)[1]: v for k, v in zip(CHANGED, values)},
                    "corpus": "packages" if trial.params["data.path"] == packages else "offline corpus",
                    "split_seed": trial.params["data.split_seed"],
                    "latent": f"32->{trial.params['model.latent_len']}",
                    "epochs": epochs,
                    M.VAL_TOKEN_ACCURACY: None if trial.value is None else round(trial.value, 4),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    args = command.parser("transformer_defaults", __doc__, "data").parse_args(argv)
    command.show(run(command.data(args)), args.out)


if __name__ == "__main__":
    command.main(main)
