"""A validation's record: what training reports after each one (once an epoch by default), made
once here and read, typed, by the sweep's parts. Its serialized form (:meth:`EpochRecord.as_dict`,
read back by :meth:`EpochRecord.of_dict`) is the dict of :mod:`seqae_core.metrics`' names that
checkpoints' histories, ``metrics.json``, Tune's results and MLflow's metrics hold."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from seqae_core import metrics as M

# An epoch record's serialized form (:meth:`EpochRecord.as_dict`): each metric's number by its
# name, and ``train_loss_steps`` its ``[global step, loss]`` points.
Scores = dict[str, float | list[list[float]]]

# The metrics a record may lack (None): a test split's, the compile's (train.compile, first result), CUDA's, a pack's.
_OPTIONAL = (M.COMPILE_SECONDS, *M.TEST_METRICS, M.GPU_MEMORY_GIB, M.PACK_MEMBERS)


def score(record: Mapping[str, object], metric: str) -> float:
    """The number of ``metric`` in a record's serialized form (:meth:`EpochRecord.as_dict`), a name
    a sweep file gives (an objective, a constraint)."""
    value = record.get(metric)
    if not isinstance(value, (int, float)):
        raise KeyError(f"an epoch record has no metric {metric!r}")
    return float(value)


@dataclass(frozen=True)
class EpochRecord:
    """One validation's metrics (:mod:`seqae_core.metrics` names them, one field each), as
    Optuna's ``FrozenTrial`` is a trial's: plain values, checked when made, no references back.

    ``spread``: a repeated trial's standard errors and per-seed values of its validation and test
    metrics (``val_loss_stderr``, ``seed_1/val_loss``), in :func:`seqae_core.metrics.across_seeds`'
    order; ``system``: the machine's use over the part (``system/cpu_utilization_percentage``, a
    sweep's worker's :class:`~sweeps.running.system_metrics.SystemMetrics`)."""

    epoch: float  # epochs trained: whole at an epoch's end, a fraction between (M.EPOCH)
    validation: int  # the result's number, 1, 2, ...: the epoch's by default
    train_loss: float
    val_loss: float
    val_token_accuracy: float
    val_sequence_accuracy: float
    lr: float
    tokens_per_s: float
    epoch_seconds: float
    epoch_cpu_seconds: float
    validation_cpu_seconds: float
    latent_fraction: float
    latent_floats: int
    latent_share: float
    best_epoch: float
    best_val_token_accuracy: float
    data_seconds: float
    global_step: int
    train_loss_steps: tuple[tuple[int, float], ...]  # (global step, mean loss since the previous point)
    compile_seconds: float | None = None
    test_loss: float | None = None
    test_token_accuracy: float | None = None
    test_sequence_accuracy: float | None = None
    gpu_memory_gib: float | None = None
    pack_members: int | None = None
    spread: Mapping[str, float] = field(default_factory=dict)
    system: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.validation < 1 or not self.epoch > 0:
            raise ValueError(f"an epoch record's validation={self.validation} and epoch={self.epoch} must be positive")
        if not math.isfinite(self.train_loss):
            raise ValueError(f"an epoch record's train_loss={self.train_loss} is not finite")
        for name in (M.VAL_TOKEN_ACCURACY, M.VAL_SEQUENCE_ACCURACY, M.TEST_TOKEN_ACCURACY, M.TEST_SEQUENCE_ACCURACY):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"an epoch record's {name}={value} must be in [0, 1]")
        scored = (*M.VAL_METRICS, *M.TEST_METRICS)
        if bad := [key for key in self.spread if not M.is_spread(key) or M.base_metric(key) not in scored]:
            raise ValueError(f"an epoch record's spread holds {bad}: only the seeds' spread of {scored}")
        if bad := [key for key in self.system if not key.startswith(M.SYSTEM_PREFIX)]:
            raise ValueError(f"an epoch record's system metrics {bad} must start with {M.SYSTEM_PREFIX!r}")

    def value(self, metric: str) -> float:
        """The value of ``metric``, a name a sweep file gives (an objective, a constraint)."""
        return score(self.as_dict(), metric)

    def as_dict(self) -> Scores:
        """The serialized form: every metric by its name, in the order training has always
        reported them (a checkpoint's history and ``metrics.json`` hold it)."""

        def scores(names: tuple[str, ...]) -> dict[str, float]:
            out: dict[str, float] = {}
            for name in names:
                if getattr(self, name) is not None:
                    out[name] = getattr(self, name)
                    out.update({k: v for k, v in self.spread.items() if M.base_metric(k) == name})
            return out

        optional = {name: getattr(self, name) for name in (M.COMPILE_SECONDS,) if getattr(self, name) is not None}
        return {
            M.EPOCH: self.epoch,
            M.VALIDATION: self.validation,
            M.TRAIN_LOSS: self.train_loss,
            **scores(M.VAL_METRICS),
            M.LEARNING_RATE: self.lr,
            M.TOKENS_PER_S: self.tokens_per_s,
            M.EPOCH_SECONDS: self.epoch_seconds,
            M.EPOCH_CPU_SECONDS: self.epoch_cpu_seconds,
            M.VALIDATION_CPU_SECONDS: self.validation_cpu_seconds,
            M.LATENT_FRACTION: self.latent_fraction,
            M.LATENT_FLOATS: self.latent_floats,
            M.LATENT_SHARE: self.latent_share,
            M.BEST_EPOCH: self.best_epoch,
            M.BEST_VAL_TOKEN_ACCURACY: self.best_val_token_accuracy,
            M.DATA_SECONDS: self.data_seconds,
            **optional,
            M.GLOBAL_STEP: self.global_step,
            M.TRAIN_LOSS_STEPS: [[step, loss] for step, loss in self.train_loss_steps],
            **scores(M.TEST_METRICS),
            **({M.GPU_MEMORY_GIB: self.gpu_memory_gib} if self.gpu_memory_gib is not None else {}),
            **({M.PACK_MEMBERS: self.pack_members} if self.pack_members is not None else {}),
            **self.system,
        }

    @classmethod
    def of_dict(cls, record: Mapping[str, Any]) -> EpochRecord:
        """A record from its serialized form (:meth:`as_dict`), or from a dict that holds it among
        other keys (Tune's result); a key of neither kind is left out. A required metric that is
        missing is a ``KeyError`` naming it."""
        fields = {name: record[name] for name in _REQUIRED}
        fields.update({name: record[name] for name in _OPTIONAL if name in record})
        return cls(
            **fields,
            epoch=record[M.EPOCH],
            validation=M.result_number(record),
            train_loss_steps=tuple((int(step), float(loss)) for step, loss in record[M.TRAIN_LOSS_STEPS]),
            spread={k: v for k, v in record.items() if M.is_spread(k)},
            system={k: v for k, v in record.items() if k.startswith(M.SYSTEM_PREFIX)},
        )


_REQUIRED = (
    M.TRAIN_LOSS,
    *M.VAL_METRICS,
    M.LEARNING_RATE,
    M.TOKENS_PER_S,
    M.EPOCH_SECONDS,
    M.EPOCH_CPU_SECONDS,
    M.VALIDATION_CPU_SECONDS,
    M.LATENT_FRACTION,
    M.LATENT_FLOATS,
    M.LATENT_SHARE,
    M.BEST_EPOCH,
    M.BEST_VAL_TOKEN_ACCURACY,
    M.DATA_SECONDS,
    M.GLOBAL_STEP,
)
