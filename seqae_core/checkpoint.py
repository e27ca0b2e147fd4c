"""A training run's checkpoints in its record store (``seqae_core.records``): what
``seqae_core.train`` reports each epoch, as the bytes of an epoch record (``state.pt``) and, on a
new best, of a best-model record (the model, sample reconstructions and metrics); and those bytes
read back. Tensors are saved with ``torch.save`` and loaded ``weights_only``."""

from __future__ import annotations

import io
import json
from typing import Any

import torch

from seqae_core import data as data_lib
from seqae_core.records import METRICS, MODEL, SAMPLES_JSON, SAMPLES_TXT, STATE, RecordStore


class CheckpointStore(RecordStore):
    """A record store that training saves its checkpoints in and resumes from."""

    def save(self, metrics: dict[str, Any], checkpoint: dict[str, Any]) -> None:
        """An epoch's checkpoint (``seqae_core.train``'s report), and the best-model record when
        the epoch is a new best (its checkpoint then carries sample reconstructions)."""
        epoch = checkpoint["epoch"]
        self.save_epoch(epoch, checkpoint, {key: checkpoint[key] for key in ("history", "finished", "patience_spent")})
        samples = checkpoint["samples"]
        if samples is not None:
            self.save_best(epoch, {
                MODEL: tensor_bytes({"config": checkpoint["config"], "model": checkpoint["model"],
                                     "token_ids": checkpoint["token_ids"]}),
                SAMPLES_JSON: json.dumps(samples).encode(),
                SAMPLES_TXT: samples_text(samples).encode(),
                METRICS: json.dumps(metrics, indent=1).encode(),
            }, {"metrics": metrics})

    def resume(self) -> tuple[dict[str, Any] | None, list[str]]:
        """The newest valid checkpoint (or None) and notes on the records skipped for it."""
        loaded = self.latest("epoch")
        return (None if loaded.epoch is None else tensors(loaded.files[STATE])), loaded.skipped

    def save_epoch(self, epoch: int, state: dict[str, Any], meta: dict[str, Any] | None = None) -> None:
        self._write(f"epoch-{epoch:06d}", {STATE: tensor_bytes(state)}, {"epoch": epoch, **(meta or {})})
        self._prune("epoch", self.keep)


def tensor_bytes(obj: Any) -> bytes:
    """``torch.save`` into memory; read back with :func:`tensors`."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def tensors(data: bytes) -> Any:
    """What :func:`tensor_bytes` saved, on the CPU (``weights_only``: no code runs from the file)."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def samples_text(samples: list[dict[str, list[str]]]) -> str:
    """Originals and reconstructions, one pair per sample; wrong tokens are marked ``[[like this]]``."""
    lines = []
    for n, sample in enumerate(samples, 1):
        wrong = sum(o != r for o, r in zip(sample["original"], sample["reconstruction"]))
        lines += [
            f"# sample {n}: {len(sample['original']) - wrong}/{len(sample['original'])} tokens right",
            "original:      " + data_lib.detokenize(sample["original"]),
            "reconstructed: " + marked(sample["original"], sample["reconstruction"]),
            "",
        ]
    return "\n".join(lines)


def marked(original: list[str], reconstruction: list[str]) -> str:
    """The reconstruction as text, each token that differs from the original's ``[[like this]]``."""
    return data_lib.detokenize([r if r == o else f"[[{r}]]" for o, r in zip(original, reconstruction)])
