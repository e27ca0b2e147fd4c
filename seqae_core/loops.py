"""One seed's training state (:class:`Replicate`: its model, optimizer, schedule and random
stream) and the two inner loops over an epoch's steps: one seed's (:func:`train_steps`) and a
pack's, every member in one batched model (:func:`train_pack_steps`). A non-finite loss is found
where the host reads the device, and named by its step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from seqae_core import data as data_lib
from seqae_core.checkpoint import RngState, SeedState
from seqae_core.config import Config
from seqae_core.device import autocast
from seqae_core.fused import Pack
from seqae_core.loss import HeadPlan
from seqae_core.model import ReducingAutoencoder
from seqae_core.schedule import lr_factor
from seqae_core.step import TrainStep, compiles, fill_batch


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


class Interrupted(RuntimeError):
    """Training stopped before a step because its caller asked (``interrupt``): the steps since
    the last report are dropped, and the run continues exactly from that report's checkpoint."""


Interrupt = Callable[[], bool]  # asked before every optimizer step: True stops the training there


@dataclass
class Replicate:
    """One seed's model, optimizer and schedule, with its own random stream: the seeds of a run
    with ``train.repeats`` > 1 never draw from each other's, so its first seed trains exactly as
    the run with one seed does."""

    seed: int
    model: ReducingAutoencoder
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    rng: RngState
    step: TrainStep

    @classmethod
    def create(
        cls,
        config: Config,
        seed: int,
        vocab_size: int,
        dev: torch.device,
        steps_per_epoch: int,
        plan: HeadPlan,
        pad_id: int,
    ) -> Replicate:
        torch.manual_seed(seed)
        model = ReducingAutoencoder(config, vocab_size).to(dev)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay, fused=True
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_factor(config.train, steps_per_epoch, config.data.input_len)
        )
        step = TrainStep(
            model,
            optimizer,
            scheduler,
            plan=plan,
            autocast=lambda: autocast(config, dev),
            pad_id=pad_id,
            device=dev,
            backend="inductor" if compiles(config.train.compile, dev) else None,
        )
        return cls(seed, model, optimizer, scheduler, _rng_state(dev), step)

    def state(self) -> SeedState:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": self.rng,
        }

    def load(self, state: SeedState) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.rng = state["rng"]

    @contextmanager
    def drawing(self, dev: torch.device) -> Iterator[None]:
        """Draw from this seed's stream (dropout) inside the block."""
        torch.set_rng_state(self.rng["torch"])
        if dev.type == "cuda" and self.rng.get("cuda"):
            torch.cuda.set_rng_state_all(self.rng["cuda"])
        yield
        self.rng = _rng_state(dev)


def _rng_state(dev: torch.device) -> RngState:
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if dev.type == "cuda" else []}


def train_steps(
    replicate: Replicate,
    splits: data_lib.Splits,
    config: Config,
    dev: torch.device,
    epoch: int,
    steps: range,
    steps_per_epoch: int,
    progress: bool,
    interrupt: Interrupt | None = None,
) -> tuple[float, list[list[float]]]:
    """The ``steps`` of an epoch (0-based: a whole epoch, or the part between two validations)
    of one seed, in the epoch's order drawn from ``(seed, epoch)``: their mean training loss, and
    their points of the training-loss curve. The host reads the device once a log window (and at
    the part's end, where a new window starts), where a non-finite loss is found and named by its step."""
    model, bs, step = replicate.model, config.train.batch_size, replicate.step
    model.train()
    step.count_from(steps.start)
    order = _order(replicate.seed, epoch, len(splits.train))
    loss_sum, tokens = 0.0, 0
    curve: list[list[float]] = []  # [global step, mean loss since the previous point]
    which = f" seed {replicate.seed}" if config.train.repeats > 1 else ""
    bar = tqdm(
        range(steps.start * bs, min(steps.stop * bs, len(order)), bs),
        desc=f"epoch {epoch}/{config.train.epochs}{which}",
        disable=not progress,
        leave=False,
    )

    def read() -> float:
        nonlocal loss_sum, tokens
        window = step.read()
        if window.bad_step:
            raise NonFiniteLossError(f"training loss is not finite at epoch {epoch}, step {window.bad_step}{which}")
        loss_sum, tokens = loss_sum + window.loss * window.tokens, tokens + window.tokens
        if progress:
            bar.set_postfix(loss=f"{window.loss:.4f}")
        return window.loss

    for number, i in enumerate(bar, steps.start + 1):
        _check(interrupt, epoch, number)
        batch = splits.batch(splits.train[order[i : i + bs]])
        if step.compiled:  # one shape for the compiled graph: the short last batch filled with padding
            batch = fill_batch(batch, bs, splits.pad_id)
        step(batch.to(dev, non_blocking=True))
        global_step = (epoch - 1) * steps_per_epoch + number
        if global_step % config.train.log_every_steps == 0:
            curve.append([global_step, read()])
    read()  # the part's last steps, and its check, before anything is reported or checkpointed
    return loss_sum / max(tokens, 1), curve


def _check(interrupt: Interrupt | None, epoch: int, number: int) -> None:
    if interrupt is not None and interrupt():
        raise Interrupted(f"training stopped before step {number} of epoch {epoch}")


def _order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of an epoch's ``n`` training samples for ``seed``, drawn from ``(seed, epoch)``."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).numpy()


def train_pack_steps(
    pack: Pack,
    replicates: list[Replicate],
    labels: list[str],
    splits: data_lib.Splits,
    config: Config,
    dev: torch.device,
    epoch: int,
    steps: range,
    steps_per_epoch: int,
    progress: bool,
    fail_fast: bool,
    interrupt: Interrupt | None = None,
) -> tuple[list[float], list[list[list[float]]], list[str | None]]:
    """The ``steps`` of an epoch of every member of a pack, each in its own order drawn from
    ``(seed, epoch)``: what :func:`_train_steps` returns for each member, in the members' order, and
    each member's non-finite loss (None where there was none), named by its step and ``labels[i]``.
    The part ends early at the first (``fail_fast``) or once every member has one."""
    bs = config.train.batch_size
    pack.train()
    pack.count_from(steps.start)
    orders = [_order(r.seed, epoch, len(splits.train)) for r in replicates]
    loss_sums, tokens = [0.0] * len(replicates), [0] * len(replicates)
    curves: list[list[list[float]]] = [
        [] for _ in replicates
    ]  # each member's [global step, mean loss since its previous point]
    errors: list[str | None] = [None] * len(replicates)
    bar = tqdm(
        range(steps.start * bs, min(steps.stop * bs, len(splits.train)), bs),
        desc=f"epoch {epoch}/{config.train.epochs} {len(replicates)} fused",
        disable=not progress,
        leave=False,
    )

    def read() -> list[float]:
        windows = pack.read()
        for i, window in enumerate(windows):
            if window.bad_step and errors[i] is None:
                errors[i] = f"training loss is not finite at epoch {epoch}, step {window.bad_step}{labels[i]}"
            loss_sums[i], tokens[i] = loss_sums[i] + window.loss * window.tokens, tokens[i] + window.tokens
        if progress:
            bar.set_postfix(loss=f"{sum(w.loss for w in windows) / len(windows):.4f}")
        return [window.loss for window in windows]

    for number, i in enumerate(bar, steps.start + 1):
        _check(interrupt, epoch, number)
        batch = torch.stack([splits.batch(splits.train[order[i : i + bs]]) for order in orders])  # (k, b, t)
        pack(batch.to(dev, non_blocking=True))
        global_step = (epoch - 1) * steps_per_epoch + number
        if global_step % config.train.log_every_steps == 0:
            for curve, loss in zip(curves, read()):
                curve.append([global_step, loss])
            if any(errors) if fail_fast else all(errors):
                break
    read()  # the part's last steps, and their check, before anything is reported or checkpointed
    return [total / max(count, 1) for total, count in zip(loss_sums, tokens)], curves, errors
