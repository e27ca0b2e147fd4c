"""Metric names, in one place, and the padding-aware scores behind them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Reported after every validation: once an epoch by default, more often with train.validate_every.
EPOCH = "epoch"  # epochs trained: whole at an epoch's end, a fraction (1.25) at a validation between
VALIDATION = "validation"  # the result's number, 1, 2, ...: the epoch's by default
TRAIN_LOSS = "train_loss"
VAL_LOSS = "val_loss"
VAL_TOKEN_ACCURACY = "val_token_accuracy"
VAL_SEQUENCE_ACCURACY = "val_sequence_accuracy"
VAL_METRICS: tuple[str, ...] = (VAL_LOSS, VAL_TOKEN_ACCURACY, VAL_SEQUENCE_ACCURACY)
LEARNING_RATE = "lr"
TOKENS_PER_S = "tokens_per_s"
EPOCH_SECONDS = "epoch_seconds"
# The epoch's CPU time of the training process (every thread): what a trial costs when the
# machine is shared, where wall time also counts the other processes' turns.
EPOCH_CPU_SECONDS = "epoch_cpu_seconds"
# Of EPOCH_CPU_SECONDS, the scoring's: the validation pages and, at a new best, the test pages. What
# validating this often costs (train.validate_every), apart from the steps trained.
VALIDATION_CPU_SECONDS = "validation_cpu_seconds"
RESOURCE_SECONDS = "resource_seconds"  # a sweep trial's training wall time x the CPUs or GPU fraction it held
LATENT_FRACTION = "latent_fraction"  # latent_len / input_len, constant per trial
LATENT_FLOATS = "latent_floats"  # latent_len x latent_dim: the floats a sample is compressed to, constant per trial
LATENT_SHARE = "latent_share"  # latent floats / the embedded input's (input_len x d_model), constant per trial
BEST_EPOCH = "best_epoch"
BEST_VAL_TOKEN_ACCURACY = "best_val_token_accuracy"
# The kept checkpoint's (the best epoch's so far) scores on the test pages, which nothing selects
# on: scored each time early stopping keeps a new best, so a trial has them however it ends.
TEST_LOSS = "test_loss"
TEST_TOKEN_ACCURACY = "test_token_accuracy"
TEST_SEQUENCE_ACCURACY = "test_sequence_accuracy"
TEST_METRICS: tuple[str, ...] = (TEST_LOSS, TEST_TOKEN_ACCURACY, TEST_SEQUENCE_ACCURACY)
GLOBAL_STEP = "global_step"  # optimizer steps since the start, at the end of the epoch
# The epoch's points of the training-loss curve: [global step, mean loss over the steps since the
# previous point] every train.log_every_steps steps; in MLflow, one value per point at its global step.
TRAIN_LOSS_STEPS = "train_loss_steps"
# MLflow's own system metrics (``system/cpu_utilization_percentage``, ...): a sweep's workers
# sample what MLflow's monitors read (psutil, NVML) and record each epoch's means; MLflow's UI shows them apart.
SYSTEM_PREFIX = "system/"

DATA_SECONDS = "data_seconds"  # this process's data start-up: a cache hit takes well under a second
# With train.compile on: the first step's seconds, torch.compile's tracing and code generation in
# them, reported with epoch 1 and in the final metrics (the epoch's time and cost include it).
COMPILE_SECONDS = "compile_seconds"
GPU_MEMORY_GIB = "gpu_memory_gib"  # on CUDA: the most GPU memory this trial's tensors held so far
# A sweep's pack (seqae_core.members): the trials that trained the part in one batched model, this
# one among them. Its timings are then its share: the pack's seconds over this count.
PACK_MEMBERS = "pack_members"

# Summaries in the trainer's final result.
EPOCHS_RUN = "epochs_run"
STOPPED_EARLY = "stopped_early"
TRAIN_SECONDS = "train_seconds"

PER_EPOCH: tuple[str, ...] = (
    EPOCH,
    VALIDATION,
    TRAIN_LOSS,
    VAL_LOSS,
    VAL_TOKEN_ACCURACY,
    VAL_SEQUENCE_ACCURACY,
    LEARNING_RATE,
    TOKENS_PER_S,
    EPOCH_SECONDS,
    EPOCH_CPU_SECONDS,
    VALIDATION_CPU_SECONDS,
    LATENT_FRACTION,
    LATENT_FLOATS,
    LATENT_SHARE,
    BEST_EPOCH,
    BEST_VAL_TOKEN_ACCURACY,
    DATA_SECONDS,
    GLOBAL_STEP,
)
CUDA_PER_EPOCH: tuple[str, ...] = (GPU_MEMORY_GIB,)  # reported besides those on CUDA only
PACK_PER_EPOCH: tuple[str, ...] = (PACK_MEMBERS,)  # reported besides those by a sweep's pack's members
# Reported besides those with a test split (data.test_fraction > 0): TEST_METRICS.
# What a sweep may optimize, and the direction that makes sense for each.
OBJECTIVES: dict[str, tuple[str, ...]] = {
    VAL_TOKEN_ACCURACY: ("max",),
    VAL_SEQUENCE_ACCURACY: ("max",),
    VAL_LOSS: ("min",),
    TRAIN_LOSS: ("min",),
    LATENT_FRACTION: ("min", "max"),
    LATENT_FLOATS: ("min", "max"),
    LATENT_SHARE: ("min", "max"),
    TOKENS_PER_S: ("max",),
}
# A trial with train.repeats > 1 trains one model per seed (train.seed, train.seed + 1, ...): its
# VAL_METRICS and TEST_METRICS are then the seeds' mean, and each is reported besides as its
# standard error (``val_token_accuracy_stderr``) and per seed (``seed_1/val_token_accuracy``).


def seed_key(seed: int, metric: str) -> str:
    return f"seed_{seed}/{metric}"


def stderr_key(metric: str) -> str:
    return f"{metric}_stderr"


def across_seeds(per_seed: dict[int, dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the seeds; with more than one seed, also its standard error (the
    sample standard deviation over sqrt(seeds)) and every seed's own value."""
    n = len(per_seed)
    merged: dict[str, float] = {}
    for metric in next(iter(per_seed.values())):
        values = [scores[metric] for scores in per_seed.values()]
        merged[metric] = statistics.fmean(values)
        if n > 1:
            merged[stderr_key(metric)] = statistics.stdev(values) / math.sqrt(n)
            merged.update({seed_key(seed, metric): scores[metric] for seed, scores in per_seed.items()})
    return merged


def seed_values(record: Mapping[str, Any], metric: str) -> dict[int, float]:
    """Each seed's value of ``metric`` in a record of a repeated trial ({} for one seed)."""
    suffix = f"/{metric}"
    return {
        int(key[len("seed_") : -len(suffix)]): value
        for key, value in record.items()
        if key.startswith("seed_") and key.endswith(suffix)
    }


def is_spread(key: str) -> bool:
    """Whether ``key`` is a repeated trial's standard error or per-seed value."""
    return key.startswith("seed_") or key.endswith("_stderr")


def value_text(value: float, record: Mapping[str, Any], metric: str, seeds: bool = False) -> str:
    """``value`` of ``metric`` as text, with its spread where ``record`` (a repeated trial's record,
    or its ``seqae.seeds``) has one: ``0.9921 ± 0.0012``, and with ``seeds`` ``0.9921 ± 0.0012
    (s.e.; seeds 4: 0.9910, 5: 0.9932)``; ``0.9921`` for a trial of one seed."""
    if not seed_values(record, metric):
        return f"{value:.4f}"
    spread = f"{value:.4f} ± {record[stderr_key(metric)]:.4f}"
    return spread + (f" (s.e.; seeds {seeds_text(record, metric)})" if seeds else "")


def seeds_text(record: Mapping[str, Any], metric: str) -> str:
    """``4: 0.9910, 5: 0.9932``: each seed's value of ``metric`` in a repeated trial's record."""
    return ", ".join(f"{seed}: {value:.4f}" for seed, value in sorted(seed_values(record, metric).items()))


def base_metric(key: str) -> str:
    """The metric a key reports: ``val_loss`` for ``val_loss``, ``val_loss_stderr`` and ``seed_1/val_loss``."""
    return key.rpartition("/")[2].removesuffix("_stderr") if is_spread(key) else key


def result_number(record: Mapping[str, Any]) -> int:
    """A record's result number (:data:`VALIDATION`): what keys its intermediate value, its MLflow
    step and its cost. A record written before train.validate_every has none: its epoch's."""
    return int(record.get(VALIDATION, record[EPOCH]))


def duration_text(seconds: float) -> str:
    """``seconds`` as a person reads a time left: ``1h05m``, ``4m09s``, ``25s``."""
    minutes, s = divmod(round(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else f"{m}m{s:02d}s" if m else f"{s}s"


def epoch_text(epochs: float) -> str:
    """Epochs trained as a person reads them: ``3`` at an epoch's end, ``2.25`` between."""
    return f"{epochs:.0f}" if float(epochs).is_integer() else f"{epochs:.2f}"


# Early stopping watches this one (the paper's patience of 5 epochs).
MONITOR = VAL_TOKEN_ACCURACY  # higher is better


def kept_epoch(points: Iterable[tuple[int, float]]) -> int | None:
    """The epoch early stopping keeps of ``(epoch, monitored value)`` points: the first of the
    best (a later epoch must beat it to be kept); None for no points."""
    best = max(points, key=lambda point: (point[1], -point[0]), default=None)
    return None if best is None else best[0]


@dataclass
class Scores:
    """Sums over non-pad tokens; add batches, then read the means."""

    loss_sum: float = 0.0
    tokens: int = 0
    correct: int = 0
    sequences: int = 0
    exact: int = 0

    def add(self, other: Scores) -> None:
        self.loss_sum += other.loss_sum
        self.tokens += other.tokens
        self.correct += other.correct
        self.sequences += other.sequences
        self.exact += other.exact

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.tokens, 1)

    @property
    def token_accuracy(self) -> float:
        return self.correct / max(self.tokens, 1)

    @property
    def sequence_accuracy(self) -> float:
        return self.exact / max(self.sequences, 1)
