"""The paper's training recipe, knowing nothing of Ray or MLflow.

``train(config, report)`` trains a :class:`ReducingAutoencoder` to reconstruct its input,
calls ``report(metrics, checkpoint)`` after every epoch and returns the final metrics. The
checkpoint is a dict holding everything needed to continue exactly: model, optimizer, scheduler,
early-stopping state, epoch, RNG state and the metric history. The data order of an epoch is
drawn from ``(train.seed, epoch)``, so a resumed run sees the batches an uninterrupted one would.
Its epoch loop (:func:`train_runs`) also trains a sweep's trials of one shape as one pack
(:func:`seqae_core.members.train_members`), each kept as its own :class:`Run`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from seqae_core import data as data_lib
from seqae_core import metrics as M
from seqae_core.checkpoint import Checkpoint
from seqae_core.config import Config, TrainConfig, from_flat
from seqae_core.fused import Pack, fuses
from seqae_core.loss import HeadPlan, Tally, plan_head, score, targets_of
from seqae_core.model import ReducingAutoencoder
from seqae_core.schedule import lr_schedule
from seqae_core.step import TrainStep, compiles, fill_batch
from seqae_errors import ConfigError

Report = Callable[[dict[str, Any], Checkpoint], None]
RESUMABLE_CHANGES = ("train.epochs", "train.fuse_repeats")  # a resumed run may change them: they train the same run
SAMPLES = 8  # validation samples shown beside their reconstructions


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


class Interrupted(RuntimeError):
    """Training stopped before a step because its caller asked (``interrupt``): the steps since
    the last report are dropped, and the run continues exactly from that report's checkpoint."""


Interrupt = Callable[[], bool]  # asked before every optimizer step: True stops the training there


@dataclass
class EarlyStopping:
    """Patience on the monitored metric (higher is better), counted in results: ``epoch`` is a
    result's number, which is the epoch's under the default ``train.validate_every`` (once an
    epoch); :func:`train` gives it ``train.patience`` x the validations an epoch."""

    patience: int
    best: float = -math.inf
    best_epoch: int = 0
    bad_epochs: int = 0

    def update(self, value: float, epoch: int) -> bool:
        """Record an epoch's value; True when it is a new best."""
        if value > self.best:
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
            return True
        self.bad_epochs += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.bad_epochs >= self.patience


def validation_steps(train: TrainConfig, steps_per_epoch: int) -> list[int]:
    """The steps of an epoch after which it validates (``train.validate_every``), its last step
    always among them: every N steps, or at each k-th of the epoch, at the first step that reaches
    it (so a scheduler's rung at a fractional epoch falls on a validation); ``[steps_per_epoch]``
    by default. An epoch shorter than the setting asks is a :class:`ConfigError`."""
    every, steps = train.validate_every, steps_per_epoch
    if every is None:
        return [steps]
    if isinstance(every, int):
        if every > steps:
            raise ConfigError(f"train.validate_every={every} steps is more than an epoch's {steps} steps: set it to "
                              f"at most {steps}, or leave it unset to validate once an epoch")
        return [*range(every, steps, every), steps]
    count = round(1 / every)
    if count > steps:
        raise ConfigError(f"train.validate_every={every} asks for {count} validations an epoch, which has {steps} "
                          "steps: validate less often")
    return [-(-i * steps // count) for i in range(1, count + 1)]  # ceil(i * steps / count)


def lr_factor(train: TrainConfig, steps_per_epoch: int, input_len: int) -> Callable[[int], float]:
    """Multiplier of ``train.lr`` at an optimizer step (:func:`seqae_core.schedule.lr_schedule`), as a
    function: ``LambdaLR`` saves a callable object's fields in its state, a function's not."""
    schedule = lr_schedule(train, steps_per_epoch, input_len)
    return lambda step: schedule(step)


def pick_device(device: str | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def native_bf16_flags() -> list[str]:
    """The CPU's bf16 instruction sets (``avx512_bf16``, ``amx_bf16``) as Linux lists them;
    empty where there are none or /proc/cpuinfo cannot be read (then bf16 would be emulated)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in ("avx512_bf16", "amx_bf16") if flag in flags]


def autocast_dtype(config: Config, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``train.precision`` on ``device``: under ``auto``, bf16 on CUDA and
    on CPUs with native bf16 instructions (faster there at the same accuracy, as measured in
    docs/explanation/performance.md), else fp32; bf16 anywhere under ``bf16``; None (full fp32) otherwise."""
    precision = config.train.precision
    if precision == "bf16" or (precision == "auto" and (device.type == "cuda" or native_bf16_flags())):
        return torch.bfloat16
    return None


def describe_precision(config: Config, device: torch.device) -> str:
    """What ``train.precision`` resolves to on ``device``, and why, for the user to read."""
    if autocast_dtype(config, device) is None:
        reason = "" if config.train.precision == "fp32" else " (this CPU has no native bf16)"
        return f"fp32{reason}"
    if config.train.precision == "bf16":
        return "bf16 autocast"
    why = "CUDA" if device.type == "cuda" else f"this CPU has {'/'.join(native_bf16_flags())}"
    return f"bf16 autocast ({why})"


def autocast(config: Config, device: torch.device) -> Any:
    dtype = autocast_dtype(config, device)
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def batch_scores(model: ReducingAutoencoder, tokens: torch.Tensor, pad_id: int,
                 plan: HeadPlan | None = None) -> tuple[torch.Tensor, Tally]:
    """Mean loss over the non-pad tokens of a (b, t) batch, and its scores on the device.

    Pad positions are never scored: their targets are IGNORE (see ``seqae_core.loss`` for the
    head's ways and their cost). ``plan``: the head's, else the one ``train.head=auto`` picks."""
    plan = plan or plan_head("auto", tokens.device)
    hidden = model.decode(model.encode(tokens))  # (b, t, d)
    return score(hidden, model.head, targets_of(tokens, pad_id), plan.scoring)


@torch.no_grad()
def evaluate(model: ReducingAutoencoder, splits: data_lib.Splits, rows: np.ndarray, config: Config,
             device: torch.device, plan: HeadPlan | None = None) -> M.Scores:
    """The model's scores on ``rows`` of the samples (a split's: ``splits.val``, ``splits.test``),
    summed on the device and read once. ``plan``: the head's, else ``train.head``'s on ``device``."""
    plan = plan or plan_head(config.train.head, device)
    model.eval()
    total = Tally.zeros(device)
    size = config.train.batch_size * 4
    for i in range(0, len(rows), size):
        tokens = splits.batch(rows[i : i + size]).to(device, non_blocking=True)
        with autocast(config, device):
            _, tally = batch_scores(model, tokens, splits.pad_id, plan)
        total.add_(tally)
    return total.read()


@torch.no_grad()
def reconstruct(model: ReducingAutoencoder, splits: data_lib.Splits, device: torch.device) -> list[dict[str, list[str]]]:
    """The first validation samples beside their reconstructions, as token strings."""
    model.eval()
    tokens = splits.batch(splits.val[:SAMPLES]).to(device)
    predicted = model(tokens).argmax(dim=-1)  # (b, t)
    vocab = splits.vocab()
    samples = []
    for original, output in zip(tokens.tolist(), predicted.tolist()):
        length = len(data_lib.decode(vocab, original, splits.pad_id))
        samples.append({"original": [vocab[i] for i in original[:length]],
                        "reconstruction": [vocab[i] for i in output[:length]]})
    return samples


@dataclass
class Replicate:
    """One seed's model, optimizer and schedule, with its own random stream: the seeds of a run
    with ``train.repeats`` > 1 never draw from each other's, so its first seed trains exactly as
    the run with one seed does."""

    seed: int
    model: ReducingAutoencoder
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    rng: dict[str, Any]
    step: TrainStep

    @classmethod
    def create(cls, config: Config, seed: int, vocab_size: int, dev: torch.device, steps_per_epoch: int,
               plan: HeadPlan, pad_id: int) -> Replicate:
        torch.manual_seed(seed)
        model = ReducingAutoencoder(config, vocab_size).to(dev)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay, fused=True
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(config.train, steps_per_epoch,
                                                                           config.data.input_len))
        step = TrainStep(model, optimizer, scheduler, plan=plan, autocast=lambda: autocast(config, dev),
                         pad_id=pad_id, device=dev,
                         backend="inductor" if compiles(config.train.compile, dev) else None)
        return cls(seed, model, optimizer, scheduler, _rng_state(dev), step)

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "rng": self.rng}

    def load(self, state: dict[str, Any]) -> None:
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


def _rng_state(dev: torch.device) -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if dev.type == "cuda" else []}


def _named(scores: M.Scores, names: tuple[str, ...]) -> dict[str, float]:
    """``scores`` as ``{loss, token accuracy, sequence accuracy}`` under ``names``, in that order."""
    return dict(zip(names, (scores.loss, scores.token_accuracy, scores.sequence_accuracy)))


def _train_steps(replicate: Replicate, splits: data_lib.Splits, config: Config, dev: torch.device, epoch: int,
                 steps: range, steps_per_epoch: int, progress: bool,
                 interrupt: Interrupt | None = None) -> tuple[float, list[list[float]]]:
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
    bar = tqdm(range(steps.start * bs, min(steps.stop * bs, len(order)), bs), desc=f"epoch {epoch}/{config.train.epochs}{which}",
               disable=not progress, leave=False)

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


def _train_pack_steps(pack: Pack, replicates: list[Replicate], labels: list[str], splits: data_lib.Splits,
                      config: Config, dev: torch.device, epoch: int, steps: range, steps_per_epoch: int,
                      progress: bool, fail_fast: bool,
                      interrupt: Interrupt | None = None) -> tuple[list[float], list[list[list[float]]], list[str | None]]:
    """The ``steps`` of an epoch of every member of a pack, each in its own order drawn from
    ``(seed, epoch)``: what :func:`_train_steps` returns for each member, in the members' order, and
    each member's non-finite loss (None where there was none), named by its step and ``labels[i]``.
    The part ends early at the first (``fail_fast``) or once every member has one."""
    bs = config.train.batch_size
    pack.train()
    pack.count_from(steps.start)
    orders = [_order(r.seed, epoch, len(splits.train)) for r in replicates]
    loss_sums, tokens = [0.0] * len(replicates), [0] * len(replicates)
    curves: list[list[list[float]]] = [[] for _ in replicates]  # each member's [global step, mean loss since its previous point]
    errors: list[str | None] = [None] * len(replicates)
    bar = tqdm(range(steps.start * bs, min(steps.stop * bs, len(splits.train)), bs),
               desc=f"epoch {epoch}/{config.train.epochs} {len(replicates)} fused", disable=not progress, leave=False)

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


def _check_resume(config: Config, resume: Checkpoint) -> None:
    """Refuse a checkpoint of another config (but for :data:`RESUMABLE_CHANGES`)."""
    saved = from_flat(resume.config).flat()
    changed = [f"{k}={saved[k]!r} -> {v!r}" for k, v in config.flat().items() if k not in RESUMABLE_CHANGES
               and saved[k] != v]
    if changed:
        raise ConfigError(f"the checkpoint was written with another config ({', '.join(changed)}); only "
                          "train.epochs (to train on) and train.fuse_repeats may change: start a new run in "
                          "another folder")


@dataclass
class Run:
    """One config's training between its validations: its seeds, early stopping, history and the
    kept checkpoint's test scores, from a fresh start or a checkpoint. What :func:`train` and
    :func:`seqae_core.members.train_members` share, so a run's records are the same whichever trains it."""

    config: Config
    replicates: list[Replicate]
    stopper: EarlyStopping
    history: list[dict[str, Any]]
    kept_test: dict[str, float]
    place: tuple[int, int]  # the epoch it trains next, and the steps of it already taken
    done: bool  # resumed from a finished checkpoint that more epochs would not train on
    error: str | None = None  # why it failed, where its loss was not finite (train_members)

    @classmethod
    def start(cls, config: Config, resume: Checkpoint | None, splits: data_lib.Splits, dev: torch.device,
              plan: HeadPlan, steps_per_epoch: int, checks: list[int]) -> Run:
        """A fresh run of ``config``, or ``resume``'s (refused where its config is another)."""
        if resume is not None:
            _check_resume(config, resume)
        replicates = [Replicate.create(config, config.train.seed + i, splits.vocab_size, dev, steps_per_epoch, plan,
                                       splits.pad_id) for i in range(config.train.repeats)]
        if resume is None:  # train.patience epochs, in validations
            return cls(config, replicates, EarlyStopping(config.train.patience * len(checks)), [], {}, (1, 0), False)
        for replicate, state in zip(replicates, resume.seeds):
            replicate.load(state)
        stopper = EarlyStopping(**resume.early_stopping)
        history = list(resume.history)
        kept_test = {k: v for k, v in history[-1].items() if M.base_metric(k) in M.TEST_METRICS}
        done = resume.finished and (stopper.should_stop or resume.epoch >= config.train.epochs)
        return cls(config, replicates, stopper, history, kept_test, (resume.epoch + 1, resume.step), done)

    def summary(self, data_seconds: float) -> dict[str, Any]:
        return summary(self.history, self.stopper, self.config.train.epochs, data_seconds)

    def score(self, splits: data_lib.Splits, dev: torch.device, plan: HeadPlan) -> tuple[dict[str, float], bool]:
        """The validation scores of its seeds (their mean, and each seed's), and whether early
        stopping keeps them as a new best (then the test pages are scored too)."""
        val = M.across_seeds({r.seed: _named(evaluate(r.model, splits, splits.val, self.config, dev, plan),
                                             M.VAL_METRICS) for r in self.replicates})
        improved = self.stopper.update(val[M.VAL_TOKEN_ACCURACY], len(self.history) + 1)
        if improved and len(splits.test):  # the checkpoint early stopping keeps, on pages nothing selects on
            self.kept_test = M.across_seeds({r.seed: _named(evaluate(r.model, splits, splits.test, self.config, dev,
                                                                     plan), M.TEST_METRICS) for r in self.replicates})
        return val, improved

    def record(self, part: Part, losses: list[float], curves: list[list[list[float]]], val: dict[str, float],
               improved: bool, scoring_cpu: float, splits: data_lib.Splits,
               dev: torch.device) -> tuple[dict[str, Any], Checkpoint]:
        """The part's metrics, appended to the history, and its checkpoint."""
        epoch, steps, config, first = part.epoch, part.steps, self.config, self.replicates[0]
        number = len(self.history) + 1  # this result's: the epoch's by default
        ends_epoch = steps.stop == part.steps_per_epoch
        bs = config.train.batch_size
        part_samples = min(steps.stop * bs, len(splits.train)) - steps.start * bs
        trained = epoch if ends_epoch else epoch - 1 + steps.stop / part.steps_per_epoch  # a fraction between epochs' ends
        metrics = {
            M.EPOCH: trained,
            M.VALIDATION: number,
            M.TRAIN_LOSS: sum(losses) / len(losses),
            **val,
            M.LEARNING_RATE: first.scheduler.get_last_lr()[0],
            M.TOKENS_PER_S: len(self.replicates) * part_samples * config.data.input_len / part.train_seconds,
            M.EPOCH_SECONDS: part.seconds,
            M.EPOCH_CPU_SECONDS: part.cpu_seconds,
            M.VALIDATION_CPU_SECONDS: scoring_cpu,
            M.LATENT_FRACTION: config.latent_fraction,
            M.LATENT_FLOATS: config.latent_floats,
            M.LATENT_SHARE: config.latent_share,
            M.BEST_EPOCH: (self.history[self.stopper.best_epoch - 1][M.EPOCH] if self.stopper.best_epoch < number
                           else trained),
            M.BEST_VAL_TOKEN_ACCURACY: self.stopper.best,
            M.DATA_SECONDS: part.data_seconds,
            **({M.COMPILE_SECONDS: first.step.compile_seconds} if number == 1 and first.step.compiled else {}),
            M.GLOBAL_STEP: (epoch - 1) * part.steps_per_epoch + steps.stop,
            M.TRAIN_LOSS_STEPS: [[points[0][0], sum(p[1] for p in points) / len(points)] for points in zip(*curves)],
            **self.kept_test,
            **({M.GPU_MEMORY_GIB: torch.cuda.max_memory_allocated(dev) / 2**30} if dev.type == "cuda" else {}),
            **part.extra,
        }
        self.history.append(metrics)
        stop = self.stopper.should_stop or (ends_epoch and epoch == config.train.epochs)
        checkpoint = Checkpoint(
            config=config.flat(), epoch=epoch if ends_epoch else epoch - 1, step=0 if ends_epoch else steps.stop,
            seeds=[r.state() for r in self.replicates],
            early_stopping=asdict(self.stopper), history=self.history, finished=stop,
            patience_spent=self.stopper.should_stop, token_ids=torch.from_numpy(splits.token_ids),
            samples=reconstruct(first.model, splits, dev) if improved else None)
        return metrics, checkpoint


@dataclass(frozen=True)
class Part:
    """The steps of an epoch up to a validation, as the runs that trained them share it."""

    epoch: int
    steps: range  # 0-based, of the epoch
    steps_per_epoch: int
    train_seconds: float  # the steps' wall time, every run's together
    seconds: float  # a run's share of the part's wall time, the validations' included
    cpu_seconds: float  # a run's share of its CPU time
    data_seconds: float
    extra: dict[str, Any]  # joins every run's metrics: the machine's use (measure), a pack's size


@dataclass(frozen=True)
class MemberResult:
    """A pack member's result of one validation (:func:`seqae_core.members.train_members`)."""

    index: int  # the member's place in the configs
    metrics: dict[str, Any] | None  # this validation's metrics, as train()'s report gets them; None when it failed
    checkpoint: Checkpoint | None  # as train()'s report gets it; None when it failed
    error: str | None = None  # why it failed: "NonFiniteLossError: training loss is not finite at epoch 2, step 5"


PackReport = Callable[[list[MemberResult]], set[int]]  # returns the indices of the members that must leave now


def train_runs(runs: list[Run], splits: data_lib.Splits, dev: torch.device, plan: HeadPlan, steps_per_epoch: int,
               checks: list[int], report: PackReport, *, fused: bool, members: bool, data_seconds: float,
               progress: bool, measure: Callable[[], dict[str, float]] | None,
               interrupt: Interrupt | None = None) -> None:
    """The epoch loop: train the runs that are not ``done`` (all at one place, of one shape) part by
    part, and give ``report`` each part's results, one per run that trained it, indexed by its place
    in ``runs``; a run leaves when it finishes, runs out of patience, fails, or ``report`` names it.

    ``fused``: as one pack (:class:`seqae_core.fused.Pack`), rebuilt from the runs' own states
    when one leaves; else each seed after another. ``members``: as a sweep's pack
    (:func:`seqae_core.members.train_members`): a run whose loss is not finite fails alone, and the
    metrics carry ``pack_members``; else a non-finite loss raises :class:`NonFiniteLossError`.
    ``interrupt``: asked before every step; True raises :class:`Interrupted` there."""
    active = [i for i, run in enumerate(runs) if not run.done]
    if not active:
        return
    pack = None
    first_epoch, first_step = runs[active[0]].place
    shared = runs[active[0]].config  # what the runs share: data, shape, epochs, batches
    for epoch, steps in _parts(first_epoch, first_step, shared.train.epochs, checks):
        trained = [runs[i] for i in active]
        replicates = [r for run in trained for r in run.replicates]
        part_start, part_cpu_start = time.perf_counter(), time.process_time()
        errors: list[str | None] = [None] * len(replicates)
        if fused:
            if pack is None:  # the runs' own states, a fresh start's, a checkpoint's or a bigger pack's
                pack = _pack(trained, splits, dev, plan, steps_per_epoch)
            labels = [f" seed {r.seed}" if run.config.train.repeats > 1 else ""
                      for run in trained for r in run.replicates]
            with replicates[0].drawing(dev):  # the pack's dropout masks, all members' from the first's stream
                losses, curves, errors = _train_pack_steps(pack, replicates, labels, splits, shared, dev, epoch, steps,
                                                           steps_per_epoch, progress, fail_fast=not members,
                                                           interrupt=interrupt)
            pack.unstack([r.model for r in replicates], [r.optimizer for r in replicates],
                         [r.scheduler for r in replicates])
        else:
            losses, curves = [], []
            for run in trained:
                for replicate in run.replicates:
                    with replicate.drawing(dev):
                        loss, curve = _train_steps(replicate, splits, run.config, dev, epoch, steps, steps_per_epoch,
                                                   progress, interrupt)
                    losses.append(loss)
                    curves.append(curve)
        if not members and any(errors):
            raise NonFiniteLossError(next(e for e in errors if e))
        train_seconds = time.perf_counter() - part_start
        outcomes: list[tuple[int, Run, slice, str | None]] = []  # each run's replicates among the part's
        start = 0
        for index, run in zip(active, trained):
            where = slice(start, start + len(run.replicates))
            outcomes.append((index, run, where, next((e for e in errors[where] if e), None)))
            start = where.stop
        scored = []
        for index, run, where, error in outcomes:
            scoring_cpu_start = time.process_time()
            scored.append(None if error else (*run.score(splits, dev, plan), time.process_time() - scoring_cpu_start))
        n = len(trained)
        part = Part(epoch, steps, steps_per_epoch, train_seconds, (time.perf_counter() - part_start) / n,
                    (time.process_time() - part_cpu_start) / n, data_seconds,
                    {**({M.PACK_MEMBERS: n} if members else {}), **(measure() if measure is not None else {})})
        results = []
        for (index, run, where, error), scores in zip(outcomes, scored):
            if scores is None:
                run.error = error
                results.append(MemberResult(index, None, None, f"{NonFiniteLossError.__name__}: {error}"))
                continue
            metrics, checkpoint = run.record(part, losses[where], curves[where], scores[0], scores[1], scores[2],
                                             splits, dev)
            results.append(MemberResult(index, dict(metrics), checkpoint))
        leaving = report(results)
        leaving |= {r.index for r in results if r.checkpoint is None or r.checkpoint.finished}
        if leaving & set(active):
            active = [i for i in active if i not in leaving]
            pack = None
        if not active:
            return


def _pack(runs: list[Run], splits: data_lib.Splits, dev: torch.device, plan: HeadPlan, steps_per_epoch: int) -> Pack:
    """The runs' seeds as one pack, from their own states; each with its run's lr, schedule and weight decay."""
    replicates = [(run.config, r) for run in runs for r in run.replicates]
    pack = Pack([r.model for _, r in replicates], lr=[c.train.lr for c, _ in replicates],
                weight_decay=[c.train.weight_decay for c, _ in replicates],
                schedule=[lr_schedule(c.train, steps_per_epoch, c.data.input_len) for c, _ in replicates], plan=plan,
                autocast=lambda: autocast(runs[0].config, dev), pad_id=splits.pad_id, device=dev)
    pack.stack([r.model for _, r in replicates], [r.optimizer for _, r in replicates],
               [r.scheduler for _, r in replicates])
    return pack


def train(
    config: Config,
    report: Report | None = None,
    *,
    resume: Checkpoint | None = None,
    device: str | None = None,
    cache_dir: Any = None,
    published: str | None = None,
    progress: bool = False,
    measure: Callable[[], dict[str, float]] | None = None,
    interrupt: Interrupt | None = None,
) -> dict[str, Any]:
    """Train and return the final metrics (those of the best epoch, plus a summary).

    ``resume`` is a checkpoint dict from ``report``; training continues after its epoch. Its
    config must be ``config`` but for ``train.epochs``: a run that reached its last epoch, given
    more, trains on (with its optimizer, schedule and patience as they were); one whose patience
    ran out stays stopped. ``published``: where a sweep's driver published the data
    (``seqae_core.data.publish``), to fetch it into ``cache_dir`` rather than tokenize it.
    ``measure``: called at the end of every epoch; what it returns joins the epoch's metrics (a
    sweep's worker adds the machine's CPU, memory and GPU use over the epoch). ``interrupt``: asked
    before every optimizer step; once it returns True, training raises :class:`Interrupted` there
    (a sweep's worker whose node is going away), to continue from the last report's checkpoint.

    With ``train.repeats`` = k > 1, k models (seeds ``train.seed`` .. ``train.seed + k - 1``) train
    side by side; every epoch's validation and test scores are their mean, with each seed's value
    and the standard error beside (:func:`seqae_core.metrics.across_seeds`); early stopping watches
    the mean. The checkpoint's model, the one a sweep registers, is the first seed's. Where
    ``train.fuse_repeats`` fuses them (:func:`seqae_core.fused.fuses`), the k seeds train as one
    batched model (:class:`seqae_core.fused.Pack`), written back into each seed's own state at every
    epoch's end: the metrics and checkpoint are as above, and a run resumes fused or not.

    Every ``train.log_every_steps`` optimizer steps, the mean loss of the steps since the previous
    point joins the epoch's ``train_loss_steps`` as ``[global step, loss]``; each epoch starts a
    new window, so a resumed run has the points of an uninterrupted one.

    Raises :class:`NonFiniteLossError` naming the epoch and step if the loss is not finite.
    """
    dev = pick_device(device)
    plan = plan_head(config.train.head, dev)  # a head this machine cannot run is refused before the data loads
    splits, data_seconds = load_data(config, dev, cache_dir, published)
    steps_per_epoch = math.ceil(len(splits.train) / config.train.batch_size)
    checks = validation_steps(config.train, steps_per_epoch)  # refused before a model is built
    run = Run.start(config, resume, splits, dev, plan, steps_per_epoch, checks)

    def forward(results: list[MemberResult]) -> set[int]:
        for result in results:
            if report is not None and result.metrics is not None and result.checkpoint is not None:
                report(result.metrics, result.checkpoint)
        return set()

    train_runs([run], splits, dev, plan, steps_per_epoch, checks, forward, fused=fuses(config, dev), members=False,
               data_seconds=data_seconds, progress=progress, measure=measure, interrupt=interrupt)
    return run.summary(data_seconds)


def load_data(config: Config, dev: torch.device, cache_dir: Any, published: str | None) -> tuple[data_lib.Splits, float]:
    """The run's data (``seqae_core.data.load``) and the seconds it took, with ``dev`` set up to train."""
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 runs' matmuls on the tensor cores (bf16 runs: no change)
        torch.backends.cudnn.allow_tf32 = True
    started = time.perf_counter()
    splits = data_lib.load(config.data, cache_dir, published)
    return splits, time.perf_counter() - started


def _parts(first_epoch: int, first_step: int, epochs: int, checks: list[int]) -> Iterator[tuple[int, range]]:
    """``(epoch, its steps up to the next validation)`` from step ``first_step`` of ``first_epoch``
    on (0-based steps; ``checks``: :func:`validation_steps`)."""
    for epoch in range(first_epoch, epochs + 1):
        start = first_step if epoch == first_epoch else 0
        for stop in checks:
            if stop > start:
                yield epoch, range(start, stop)
                start = stop


def summary(history: list[dict[str, Any]], stopper: EarlyStopping, epochs: int, data_seconds: float) -> dict[str, Any]:
    """The final metrics: those of the best result (the best epoch's by default), and how the run went."""
    best = history[stopper.best_epoch - 1]
    train_seconds = sum(h[M.EPOCH_SECONDS] for h in history)
    return {
        **{k: best[k] for k in (M.VAL_TOKEN_ACCURACY, M.VAL_LOSS, M.VAL_SEQUENCE_ACCURACY, M.TRAIN_LOSS, M.LATENT_FRACTION,
                                M.LATENT_FLOATS, M.LATENT_SHARE, *M.TEST_METRICS) if k in best},
        **{k: v for k, v in best.items() if M.is_spread(k)},
        M.BEST_EPOCH: best[M.EPOCH],
        M.EPOCHS_RUN: history[-1][M.EPOCH],  # whole unless patience stopped it between epochs' ends
        M.STOPPED_EARLY: history[-1][M.EPOCH] < epochs,
        M.TOKENS_PER_S: float(np.mean([h[M.TOKENS_PER_S] for h in history])),
        M.TRAIN_SECONDS: train_seconds,
        M.DATA_SECONDS: data_seconds,
        **{M.COMPILE_SECONDS: h[M.COMPILE_SECONDS] for h in history[:1] if M.COMPILE_SECONDS in h},
    }
