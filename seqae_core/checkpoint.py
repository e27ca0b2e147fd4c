"""A training run's checkpoints in its record store (``seqae_core.records``): what
``seqae_core.train`` reports at each validation (once an epoch by default), as the bytes of an
epoch record (``state.pt``) and, on a new best, of a best-model record (the model, sample
reconstructions and metrics); and those bytes read back. Tensors are saved with ``torch.save`` and loaded ``weights_only``."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

import torch

from seqae_core import data as data_lib
from seqae_core.borders import TorchState
from seqae_core.config import Flat
from seqae_core.epoch import EpochRecord
from seqae_core.records import METRICS, MODEL, SAMPLES_JSON, SAMPLES_TXT, STATE, RecordMeta, RecordStore
from seqae_errors import ConfigError

STATE_FORMAT = 1  # the layout of a saved state (Checkpoint.state); a state of another is refused, not misread


class RngState(TypedDict):
    """A seed's random stream: torch's CPU generator's state, and each CUDA device's ([] off CUDA)."""

    torch: torch.Tensor
    cuda: list[torch.Tensor]


class SeedState(TypedDict):
    """One seed's part of a checkpoint (``seqae_core.loops.Replicate.state``): torch's state
    dicts of its model, optimizer and schedule, and its random stream."""

    model: TorchState
    optimizer: TorchState
    scheduler: TorchState
    rng: RngState


class StopperState(TypedDict):
    """:class:`seqae_core.train.EarlyStopping`'s fields."""

    patience: int
    best: float
    best_epoch: int
    bad_epochs: int


class CheckpointState(SeedState):
    """The layout ``state.pt`` holds (:meth:`Checkpoint.state`): the first seed's state beside the
    run's, the other seeds' as ``repeats``."""

    format: int
    config: Flat
    epoch: int
    repeats: list[SeedState]
    early_stopping: StopperState
    history: list[dict[str, Any]]
    finished: bool
    patience_spent: bool
    token_ids: torch.Tensor
    samples: list[dict[str, list[str]]] | None
    step: int


@dataclass(frozen=True)
class Checkpoint:
    """A validation's checkpoint as ``seqae_core.train`` reports it: everything needed to continue
    the training exactly, and on a new best its sample reconstructions. Saved as plain tensors,
    lists and dicts (:meth:`state`, which torch loads ``weights_only``), read back by :meth:`of_state`.
    Where it stands is ``epoch`` whole epochs and ``step`` steps into the next: a validation
    between epochs' ends (``train.validate_every``) resumes there, in the epoch's data order."""

    config: Flat  # the flat config it trains
    epoch: int  # epochs trained to their end
    seeds: list[SeedState]  # each seed's model, optimizer, scheduler and random stream; train.seed's first
    early_stopping: StopperState
    history: list[dict[str, Any]]  # every epoch's metrics so far
    finished: bool  # trained to its last epoch, or stopped early
    patience_spent: bool  # stopped early: more epochs would not train it on
    token_ids: torch.Tensor  # the tokenizer's id of each of the model's ids
    samples: list[dict[str, list[str]]] | None = None  # on a new best: originals and reconstructions
    step: int = 0  # optimizer steps taken of epoch + 1 (0 at an epoch's end; a state saved before there were any: 0)

    @property
    def place(self) -> str:
        """Where it stands, for messages: ``after epoch 3``, or ``at step 40 of epoch 4``."""
        return f"at step {self.step} of epoch {self.epoch + 1}" if self.step else f"after epoch {self.epoch}"

    @property
    def number(self) -> int:
        """The result's number, which names its records: the epoch's by default."""
        return len(self.history)

    def state(self) -> CheckpointState:
        """The saved layout: the first seed's state beside the rest, the other seeds' as ``repeats``."""
        return {
            "format": STATE_FORMAT,
            "config": self.config,
            "epoch": self.epoch,
            **self.seeds[0],
            "repeats": self.seeds[1:],
            "early_stopping": self.early_stopping,
            "history": self.history,
            "finished": self.finished,
            "patience_spent": self.patience_spent,
            "token_ids": self.token_ids,
            "samples": self.samples,
            "step": self.step,
        }

    @classmethod
    def of_state(cls, state: TorchState) -> Checkpoint:
        """The checkpoint in ``state``, as torch loads it from ``state.pt``."""
        if state.get("format") != STATE_FORMAT:
            raise ConfigError(
                f"the checkpoint is of format {state.get('format')!r}, not {STATE_FORMAT!r}: start a "
                "new run in another folder"
            )
        first = SeedState(
            model=state["model"], optimizer=state["optimizer"], scheduler=state["scheduler"], rng=state["rng"]
        )
        return cls(
            state["config"],
            state["epoch"],
            [first, *state.get("repeats", [])],
            state["early_stopping"],
            state["history"],
            state["finished"],
            state["patience_spent"],
            state["token_ids"],
            state.get("samples"),
            state.get("step", 0),
        )


class CheckpointStore(RecordStore):
    """A record store that training saves its checkpoints in and resumes from."""

    def save(self, record: EpochRecord, checkpoint: Checkpoint) -> None:
        """A validation's checkpoint (``seqae_core.train``'s report), and the best-model record when
        it is a new best (its checkpoint then carries sample reconstructions, and ``record``, in
        its serialized form); named by the result's number, the epoch's by default."""
        self.save_epoch(
            checkpoint.number,
            checkpoint.state(),
            {
                "history": checkpoint.history,
                "finished": checkpoint.finished,
                "patience_spent": checkpoint.patience_spent,
            },
        )
        if checkpoint.samples is not None:
            metrics = record.as_dict()
            self.save_best(
                checkpoint.number,
                {
                    MODEL: tensor_bytes(
                        {
                            "config": checkpoint.config,
                            "model": checkpoint.seeds[0]["model"],
                            "token_ids": checkpoint.token_ids,
                        }
                    ),
                    SAMPLES_JSON: json.dumps(checkpoint.samples).encode(),
                    SAMPLES_TXT: samples_text(checkpoint.samples).encode(),
                    METRICS: json.dumps(metrics, indent=1).encode(),
                },
                {"metrics": metrics, "config": checkpoint.config},
            )  # the config outlives model.pt (release)

    def resume(self) -> tuple[Checkpoint | None, list[str]]:
        """The newest valid checkpoint (or None) and notes on the records skipped for it."""
        loaded = self.latest("epoch")
        if loaded.meta.get("released"):
            raise ConfigError(
                f"{self.uri}: its checkpoints were released when it ended outside the trials a sweep "
                "keeps (checkpoints.keep_best): it cannot train on"
            )
        return (None if loaded.epoch is None else Checkpoint.of_state(tensors(loaded.files[STATE]))), loaded.skipped

    def save_epoch(self, epoch: int, state: Mapping[str, object], meta: RecordMeta | None = None) -> None:
        """An epoch record of ``state`` (what ``torch.save`` takes: a :class:`CheckpointState`) and ``meta``."""
        self._write(f"epoch-{epoch:06d}", {STATE: tensor_bytes(state)}, {"epoch": epoch, **(meta or {})})
        self._prune("epoch", self.keep)


def tensor_bytes(obj: object) -> bytes:
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
