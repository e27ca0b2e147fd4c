"""The learning rate's schedule: a multiplier of ``train.lr`` at each optimizer step, as the host
computes it for a run's own ``LambdaLR`` and as a pack's optimizer computes it on the device
(:class:`seqae_core.adamw.StackedAdamW`), the same float64 arithmetic both ways."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from seqae_core.config import TrainConfig


@dataclass(frozen=True)
class Schedule:
    """Linear from 1 to ``end`` over ``decay_steps`` optimizer steps, then ``end`` (``linear``;
    0 steps: ``end`` from the start); else ``end`` throughout."""

    end: float
    decay_steps: int
    linear: bool

    def __call__(self, step: int) -> float:
        if not self.linear:
            return self.end
        return 1.0 + (self.end - 1.0) * (min(step / self.decay_steps, 1.0) if self.decay_steps else 1.0)


def lr_schedule(train: TrainConfig, steps_per_epoch: int, input_len: int) -> Schedule:
    """``train.lr_schedule``'s. linear: to ``lr_final`` over ``lr_decay_epochs`` epochs, then
    constant. constant: ``lr`` throughout. paper: linear up to 256 input tokens, ``lr_final``
    throughout above."""
    end = train.lr_final / train.lr
    if train.lr_schedule == "constant":
        return Schedule(1.0, 0, linear=False)
    if train.lr_schedule == "paper" and input_len > 256:
        return Schedule(end, 0, linear=False)
    return Schedule(end, train.lr_decay_epochs * steps_per_epoch, linear=True)


def lr_factor(train: TrainConfig, steps_per_epoch: int, input_len: int) -> Callable[[int], float]:
    """Multiplier of ``train.lr`` at an optimizer step (:func:`seqae_core.schedule.lr_schedule`), as a
    function: ``LambdaLR`` saves a callable object's fields in its state, a function's not."""
    schedule = lr_schedule(train, steps_per_epoch, input_len)
    return lambda step: schedule(step)
