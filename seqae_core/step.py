"""One training step that the device never waits on the host for, compiled where that pays.

A step queues its kernels and returns: the loss and its token count are summed on the device,
a non-finite loss is recorded there (the first step it happened at), and nothing is read back
until :meth:`TrainStep.read` at the end of a log window. Batches keep one shape (a short last
batch is filled with rows of padding, which score nothing), so a compiled graph is traced once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from seqae_core.loss import IGNORE, HeadPlan, linear_cross_entropy, targets_of
from seqae_core.model import ReducingAutoencoder


def compiles(name: str, device: torch.device) -> bool:
    """Whether ``train.compile`` = ``name`` compiles the step on ``device``. ``auto`` compiles
    nowhere yet: a trial pays the compilation before its first step, and the CPU measurements
    (docs/explanation/performance.md) found it no faster over a trial; the GPU's are to come."""
    return name == "on"


@dataclass
class Window:
    """What the host reads of the steps since the last read."""

    loss: float  # mean training loss over the window's scored tokens
    tokens: int
    bad_step: int  # the first step of the epoch whose loss was not finite, else 0


class TrainStep:
    """Forward, head loss, backward and the optimizer's step for one (b, t) batch of ``model``."""

    def __init__(
        self,
        model: ReducingAutoencoder,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        *,
        plan: HeadPlan,
        autocast: Callable[[], Any],
        pad_id: int,
        device: torch.device,
        backend: str | Callable[..., Any] | None = None,
        mode: str | None = None,
    ) -> None:
        """``backend``: torch.compile's (``"inductor"``), or None to run eagerly; ``mode``:
        inductor's (``"reduce-overhead"`` replays CUDA graphs). The graph must be whole
        (``fullgraph``: a graph break is an error, not a slowdown) and is traced for one shape
        (``dynamic=False``: another shape would be a recompilation)."""
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.plan, self.autocast, self.pad_id = plan, autocast, pad_id
        self.compiled = backend is not None
        self.compile_seconds: float | None = None  # the first call's, where compiled
        self.loss_of: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = (
            torch.compile(self._loss, backend=backend, mode=mode, fullgraph=True, dynamic=False)
            if backend is not None
            else self._loss
        )
        self._loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        self._tokens = torch.zeros((), dtype=torch.int64, device=device)
        self._step = torch.zeros((), dtype=torch.int64, device=device)
        self._bad_step = torch.zeros((), dtype=torch.int64, device=device)

    def _loss(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (b, t) -> (summed loss over the scored tokens, their count)."""
        b, t = tokens.shape
        targets = targets_of(tokens, self.pad_id).reshape(b * t)  # (b t,)
        hidden = self.model.decode(self.model.encode(tokens))  # (b, t, d)
        loss_sum, _ = linear_cross_entropy(
            hidden.reshape(b * t, -1), self.model.head, targets, self.plan, predict=False
        )
        return loss_sum, (targets != IGNORE).sum()

    def __call__(self, tokens: torch.Tensor) -> None:
        began = time.perf_counter()
        with self.autocast():
            loss_sum, count = self.loss_of(tokens)
        if self.compiled and self.compile_seconds is None:  # the one step the host waits for
            float(loss_sum.detach())
            self.compile_seconds = time.perf_counter() - began
        self.optimizer.zero_grad(set_to_none=True)
        (loss_sum / count.clamp(min=1)).backward()
        self.optimizer.step()
        self.scheduler.step()
        self._step += 1
        # The first non-finite step stays recorded: later steps of the window see NaN weights too.
        self._bad_step = torch.where(torch.isfinite(loss_sum) | (self._bad_step > 0), self._bad_step, self._step)
        self._loss_sum += loss_sum.detach()
        self._tokens += count

    def read(self) -> Window:
        """The window's scores, and zeroed sums for the next: the host's one wait per window."""
        loss_sum, tokens, bad = torch.stack(
            [self._loss_sum.double(), self._tokens.double(), self._bad_step.double()]
        ).tolist()
        self._loss_sum.zero_()
        self._tokens.zero_()
        return Window(loss=loss_sum / max(tokens, 1), tokens=int(tokens), bad_step=int(bad))

    def count_from(self, done: int) -> None:
        """The next step is the epoch's ``done + 1``-th, as the error that names a step says: 0 at
        an epoch's start, the steps already taken where it goes on after a validation or a resume."""
        self._step.fill_(done)
        self._bad_step.zero_()


def fill_batch(tokens: torch.Tensor, batch_size: int, pad_id: int) -> torch.Tensor:
    """tokens (r, t) with r <= batch_size -> (batch_size, t): the missing rows all padding."""
    missing = batch_size - tokens.shape[0]
    if missing == 0:
        return tokens
    return torch.cat([tokens, tokens.new_full((missing, tokens.shape[1]), pad_id)])
