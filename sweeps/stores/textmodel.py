"""The registered model: text in, text out, as an MLflow pyfunc logged from this file's code.

``Sweep.best_model().predict(["some text", ...])`` (or ``seqae encode``, or
``mlflow.pyfunc.load_model("models:/quickstart/1")``; a DataFrame with a ``text`` column also
goes in) returns a DataFrame with one row per text:

    reconstruction        the text the model rebuilds from its latents
    token_accuracy        the share of the input's tokens rebuilt exactly (NaN for a text without tokens)
    tokens                the input's tokens
    reconstructed_tokens  what the model made of each of them
    latents               the encoder's output, (windows, latent_len, d_model) float32

A text is tokenized as in training (no special tokens) and cut into ``data.input_len``-token
windows, the last one padded (``seqae_core.corpus``). Tokens outside the model's vocabulary (with
``data.vocab: corpus``) go in as the unknown token (or padding, if the model has no unknown token)
and count as wrong. It runs on CUDA when there is one, in the precision training used there
(``train.precision``).

The model is logged as code, not pickled: its artifacts are the weights (safetensors), the flat
config, the tokenizer's own files (serving needs no Hub) and ``token_ids.json``, the tokenizer's
id of each of the model's ids. The logged model also holds a copy of this file and of
``seqae_core`` and ``seqae_errors`` (its code paths), for ``mlflow models serve``.

What runs when a model loads: ``seqae encode`` and ``Sweep.best_model()``
(``sweeps.results.registry``) fetch those four artifacts alone and build :class:`LoadedModel`
from them with the installed code; the weights, the config (checked as any config is) and the
tokenizer's files are read as data, and no code stored with the model runs.
``mlflow models serve`` and ``mlflow.pyfunc.load_model`` run the stored copy of this file and put
the stored code paths first on ``sys.path``: whoever can write the artifact store, or move an
alias, runs code there. Serve only models from a registry whose writers you trust.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from mlflow.models import ModelSignature, set_model, validate_schema
from mlflow.pyfunc import PythonModel
from mlflow.types.schema import Array, ColSpec, DataType, Schema
from safetensors.torch import load_model, save_model
from transformers import AutoTokenizer

from seqae_core import corpus
from seqae_core.borders import MlflowParams, TorchState
from seqae_core.config import Config, from_flat
from seqae_core.device import autocast, pick_device
from seqae_core.model import ReducingAutoencoder

WEIGHTS, CONFIG, TOKENIZER, TOKEN_IDS = "weights", "config", "tokenizer", "token_ids"
# Each artifact's file (the tokenizer's a folder); a logged pyfunc model keeps them under ARTIFACTS.
FILES = {WEIGHTS: "model.safetensors", CONFIG: "config.json", TOKENIZER: "tokenizer", TOKEN_IDS: "token_ids.json"}
ARTIFACTS = "artifacts"
INPUT_EXAMPLE = [
    "Paris is the capital and largest city of France.",
    "The river rises in the hills to the north and flows south through the valley into the sea.",
]
BATCH_TOKENS = {"cpu": 4096, "cuda": 65536}  # window tokens per forward pass; the head's logits dominate memory

SIGNATURE = ModelSignature(
    inputs=Schema([ColSpec(DataType.string)]),  # a list of texts, or a DataFrame's text column
    outputs=Schema(
        [
            ColSpec(DataType.string, "reconstruction"),
            ColSpec(DataType.double, "token_accuracy"),
            ColSpec(Array(DataType.string), "tokens"),
            ColSpec(Array(DataType.string), "reconstructed_tokens"),
            ColSpec(Array(Array(Array(DataType.float))), "latents"),
        ]
    ),
)


def write_artifacts(folder: Path, saved: TorchState, tokenizer: Any) -> dict[str, str]:
    """A trial's best-model record (``config``, ``model`` state dict, ``token_ids``) as this
    model's artifacts in ``folder``; returns them by name, for ``log_model(artifacts=...)``."""
    config = from_flat(saved["config"])
    model = ReducingAutoencoder(config, len(saved["token_ids"]))
    model.load_state_dict(saved["model"])
    paths = {name: folder / file for name, file in FILES.items()}
    save_model(model, str(paths[WEIGHTS]))  # the embedding and the head share one tensor: stored once
    paths[CONFIG].write_text(json.dumps(config.flat(), indent=1))
    tokenizer.save_pretrained(paths[TOKENIZER])
    paths[TOKEN_IDS].write_text(
        json.dumps({"tokenizer": config.data.tokenizer, "token_ids": [int(i) for i in saved["token_ids"]]})
    )
    return {name: str(path) for name, path in paths.items()}


class TextAutoencoder(PythonModel):
    """Texts -> reconstructions, token accuracies and latents (see the module's docstring)."""

    def load_context(self, context: Any) -> None:
        self.load(context.artifacts)

    def load(self, artifacts: Mapping[str, str]) -> None:
        """The model from its artifacts' local paths (by name, as :data:`FILES`), with this code:
        the config checked as any config is, the tokenizer's own classes."""
        self.config: Config = from_flat(json.loads(Path(artifacts[CONFIG]).read_text()), artifacts[CONFIG])
        self.tokenizer = AutoTokenizer.from_pretrained(artifacts[TOKENIZER], trust_remote_code=False)
        self.token_ids = np.asarray(json.loads(Path(artifacts[TOKEN_IDS]).read_text())["token_ids"], dtype=np.int64)
        # The tokenizer's id -> the model's: the unknown token's where the model has no id for it
        # (with data.vocab: corpus), else the pad token's, which every model has.
        self.model_ids = np.full(len(self.tokenizer), -1, dtype=np.int64)
        self.model_ids[self.token_ids] = np.arange(len(self.token_ids))
        unk = self.tokenizer.unk_token_id
        fallback = (
            self.model_ids[unk]
            if unk is not None and self.model_ids[unk] >= 0
            else self.model_ids[self.tokenizer.pad_token_id]
        )
        self.model_ids[self.model_ids < 0] = fallback
        self.device = pick_device(None)
        self.model = ReducingAutoencoder(self.config, len(self.token_ids)).to(self.device).eval()
        load_model(self.model, artifacts[WEIGHTS], device=str(self.device))

    def predict(self, context: Any, model_input: pd.DataFrame, params: MlflowParams | None = None) -> pd.DataFrame:
        # MLflow checks the input against the signature (the hint says to take the schema from
        # there) and hands this model one column: a list's texts (column 0), or a DataFrame's first.
        column = model_input.columns[0]
        if column not in (0, "text"):
            raise ValueError(
                f"the texts go in as a list, or as a DataFrame's 'text' column, first (this model gets "
                f"a DataFrame's first column only); got column {column!r}"
            )
        texts = model_input[column].tolist()
        n = self.config.data.input_len
        windows = corpus.window_tokens(self.tokenizer, texts, n) if texts else []  # tokenizer ids, per text
        rows, _ = corpus.pad_rows(windows, n, self.tokenizer.pad_token_id)  # (r, n), each text's rows in turn
        latents, predicted = self._run(self.model_ids[rows])  # (r, s, d), (r, n) in the tokenizer's ids
        out: dict[str, list[Any]] = {
            "reconstruction": [],
            "token_accuracy": [],
            "tokens": [],
            "reconstructed_tokens": [],
            "latents": [],
        }
        start = 0
        for text_windows in windows:
            stop = start + len(text_windows)
            given = [t for window in text_windows for t in window]
            rebuilt = [int(t) for row, window in zip(predicted[start:stop], text_windows) for t in row[: len(window)]]
            right = sum(a == b for a, b in zip(given, rebuilt))
            out["reconstruction"].append(self.tokenizer.decode(rebuilt))
            out["token_accuracy"].append(right / len(given) if given else float("nan"))
            out["tokens"].append(self.tokenizer.convert_ids_to_tokens(given))
            out["reconstructed_tokens"].append(self.tokenizer.convert_ids_to_tokens(rebuilt))
            out["latents"].append(latents[start:stop])  # (windows, s, d)
            start = stop
        return pd.DataFrame(out)

    @torch.inference_mode()
    def _run(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Model-id rows (r, n) -> latents (r, s, d) float32 and the reconstruction in the tokenizer's ids (r, n)."""
        batch = max(1, BATCH_TOKENS.get(self.device.type, BATCH_TOKENS["cpu"]) // rows.shape[1])
        latents, predicted = [], []
        for i in range(0, len(rows), batch):
            tokens = torch.from_numpy(rows[i : i + batch]).to(self.device)
            with autocast(self.config, self.device):
                latent = self.model.encode(tokens)  # (b, s, d)
                logits = self.model.head(self.model.decode(latent))  # (b, n, v)
            latents.append(latent.float().cpu().numpy())
            predicted.append(logits.argmax(dim=-1).cpu().numpy())
        s, d = self.config.latent_len, self.config.model.d_model
        if not latents:
            return np.zeros((0, s, d), dtype=np.float32), np.zeros((0, rows.shape[1]), dtype=np.int64)
        return np.concatenate(latents), self.token_ids[np.concatenate(predicted)]


class LoadedModel:
    """A registered model built by the installed :class:`TextAutoencoder` from its artifacts alone
    (``seqae encode``, ``Sweep.best_model()``): ``.predict`` takes what the pyfunc takes."""

    def __init__(self, artifacts: Mapping[str, str]) -> None:
        self.model = TextAutoencoder()
        self.model.load(artifacts)

    def predict(self, texts: Sequence[str] | pd.DataFrame) -> pd.DataFrame:
        """A list of texts, or a DataFrame whose first column is ``text``: a row per text (see the
        module's docstring)."""
        validate_schema(texts, SIGNATURE.inputs)  # as the pyfunc checks its input
        return self.model.predict(None, texts if isinstance(texts, pd.DataFrame) else pd.DataFrame({0: list(texts)}))


set_model(TextAutoencoder())
