"""The paper's training recipe, knowing nothing of Ray or MLflow.

``train(config, report)`` trains a :class:`ReducingAutoencoder` to reconstruct its input,
calls ``report(record, checkpoint)`` after every epoch (an :class:`~seqae_core.epoch.EpochRecord`
and a :class:`~seqae_core.checkpoint.Checkpoint`) and returns the final metrics. The checkpoint
holds everything needed to continue exactly: model, optimizer, scheduler, early-stopping state,
epoch, RNG state and the metric history. The data order of an epoch is drawn from
``(train.seed, epoch)``, so a resumed run sees the batches an uninterrupted one would.
Its epoch loop (:func:`train_runs`) also trains a sweep's trials of one shape as one pack
(:func:`seqae_core.members.train_members`), each kept as its own :class:`Run`. The device and
precision are :mod:`seqae_core.device`'s, the scores :mod:`seqae_core.evaluation`'s, the steps of
an epoch :mod:`seqae_core.loops`'.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from seqae_core import data as data_lib
from seqae_core import metrics as M
from seqae_core.checkpoint import Checkpoint, StopperState
from seqae_core.config import Config, TrainConfig, from_flat
from seqae_core.device import autocast, pick_device, set_up
from seqae_core.epoch import EpochRecord, Scores
from seqae_core.evaluation import evaluate, named, reconstruct
from seqae_core.fused import Pack, fuses
from seqae_core.loops import Interrupt, NonFiniteLossError, Replicate, train_pack_steps, train_steps
from seqae_core.loss import HeadPlan, plan_head
from seqae_core.schedule import lr_schedule
from seqae_errors import ConfigError

Report = Callable[[EpochRecord, Checkpoint], None]
# A run's final metrics (:func:`summary`): numbers by name, ``stopped_early`` a bool.
Summary = dict[str, float]

RESUMABLE_CHANGES = ("train.epochs", "train.fuse_repeats")  # a resumed run may change them: they train the same run


@dataclass
class EarlyStopping:
    """Patience on the monitored metric (higher is better), counted in results: ``epoch`` is a
    result's number, which is the epoch's under the default ``train.validate_every`` (once an
    epoch); :func:`train` gives it ``train.patience`` x the validations an epoch."""

    patience: int
    best: float = -math.inf
    best_epoch: int = 0
    bad_epochs: int = 0

    def state(self) -> StopperState:
        """Its fields, as a checkpoint keeps them (``EarlyStopping(**state)`` reads them back)."""
        return StopperState(
            patience=self.patience, best=self.best, best_epoch=self.best_epoch, bad_epochs=self.bad_epochs
        )

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
            raise ConfigError(
                f"train.validate_every={every} steps is more than an epoch's {steps} steps: set it to "
                f"at most {steps}, or leave it unset to validate once an epoch"
            )
        return [*range(every, steps, every), steps]
    count = round(1 / every)
    if count > steps:
        raise ConfigError(
            f"train.validate_every={every} asks for {count} validations an epoch, which has {steps} "
            "steps: validate less often"
        )
    return [-(-i * steps // count) for i in range(1, count + 1)]  # ceil(i * steps / count)


def _check_resume(config: Config, resume: Checkpoint) -> None:
    """Refuse a checkpoint of another config (but for :data:`RESUMABLE_CHANGES`)."""
    saved = from_flat(resume.config).flat()
    changed = [
        f"{k}={saved[k]!r} -> {v!r}" for k, v in config.flat().items() if k not in RESUMABLE_CHANGES and saved[k] != v
    ]
    if changed:
        raise ConfigError(
            f"the checkpoint was written with another config ({', '.join(changed)}); only "
            "train.epochs (to train on) and train.fuse_repeats may change: start a new run in "
            "another folder"
        )


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
    def start(
        cls,
        config: Config,
        resume: Checkpoint | None,
        splits: data_lib.Splits,
        dev: torch.device,
        plan: HeadPlan,
        steps_per_epoch: int,
        checks: list[int],
    ) -> Run:
        """A fresh run of ``config``, or ``resume``'s (refused where its config is another)."""
        if resume is not None:
            _check_resume(config, resume)
        replicates = [
            Replicate.create(
                config, config.train.seed + i, splits.vocab_size, dev, steps_per_epoch, plan, splits.pad_id
            )
            for i in range(config.train.repeats)
        ]
        if resume is None:  # train.patience epochs, in validations
            return cls(config, replicates, EarlyStopping(config.train.patience * len(checks)), [], {}, (1, 0), False)
        for replicate, state in zip(replicates, resume.seeds):
            replicate.load(state)
        stopper = EarlyStopping(**resume.early_stopping)
        history = list(resume.history)
        kept_test = {k: v for k, v in history[-1].items() if M.base_metric(k) in M.TEST_METRICS}
        done = resume.finished and (stopper.should_stop or resume.epoch >= config.train.epochs)
        return cls(config, replicates, stopper, history, kept_test, (resume.epoch + 1, resume.step), done)

    def summary(self, data_seconds: float) -> Summary:
        return summary(self.history, self.stopper, self.config.train.epochs, data_seconds)

    def score(self, splits: data_lib.Splits, dev: torch.device, plan: HeadPlan) -> tuple[dict[str, float], bool]:
        """The validation scores of its seeds (their mean, and each seed's), and whether early
        stopping keeps them as a new best (then the test pages are scored too)."""
        val = M.across_seeds(
            {
                r.seed: named(evaluate(r.model, splits, splits.val, self.config, dev, plan), M.VAL_METRICS)
                for r in self.replicates
            }
        )
        improved = self.stopper.update(val[M.VAL_TOKEN_ACCURACY], len(self.history) + 1)
        if improved and len(splits.test):  # the checkpoint early stopping keeps, on pages nothing selects on
            self.kept_test = M.across_seeds(
                {
                    r.seed: named(evaluate(r.model, splits, splits.test, self.config, dev, plan), M.TEST_METRICS)
                    for r in self.replicates
                }
            )
        return val, improved

    def record(
        self,
        part: Part,
        losses: list[float],
        curves: list[list[list[float]]],
        val: dict[str, float],
        improved: bool,
        scoring_cpu: float,
        splits: data_lib.Splits,
        dev: torch.device,
    ) -> tuple[EpochRecord, Checkpoint]:
        """The part's record, appended to the history in its serialized form, and its checkpoint."""
        epoch, steps, config, first = part.epoch, part.steps, self.config, self.replicates[0]
        number = len(self.history) + 1  # this result's: the epoch's by default
        ends_epoch = steps.stop == part.steps_per_epoch
        bs = config.train.batch_size
        part_samples = min(steps.stop * bs, len(splits.train)) - steps.start * bs
        trained = (
            epoch if ends_epoch else epoch - 1 + steps.stop / part.steps_per_epoch
        )  # a fraction between epochs' ends
        scores = {**val, **self.kept_test}
        record = EpochRecord(
            epoch=trained,
            validation=number,
            train_loss=sum(losses) / len(losses),
            val_loss=val[M.VAL_LOSS],
            val_token_accuracy=val[M.VAL_TOKEN_ACCURACY],
            val_sequence_accuracy=val[M.VAL_SEQUENCE_ACCURACY],
            lr=float(first.scheduler.get_last_lr()[0]),
            tokens_per_s=len(self.replicates) * part_samples * config.data.input_len / part.train_seconds,
            epoch_seconds=part.seconds,
            epoch_cpu_seconds=part.cpu_seconds,
            validation_cpu_seconds=scoring_cpu,
            latent_fraction=config.latent_fraction,
            latent_floats=config.latent_floats,
            latent_share=config.latent_share,
            best_epoch=(
                self.history[self.stopper.best_epoch - 1][M.EPOCH] if self.stopper.best_epoch < number else trained
            ),
            best_val_token_accuracy=self.stopper.best,
            data_seconds=part.data_seconds,
            compile_seconds=first.step.compile_seconds if number == 1 and first.step.compiled else None,
            global_step=(epoch - 1) * part.steps_per_epoch + steps.stop,
            train_loss_steps=tuple((points[0][0], sum(p[1] for p in points) / len(points)) for points in zip(*curves)),
            test_loss=self.kept_test.get(M.TEST_LOSS),
            test_token_accuracy=self.kept_test.get(M.TEST_TOKEN_ACCURACY),
            test_sequence_accuracy=self.kept_test.get(M.TEST_SEQUENCE_ACCURACY),
            gpu_memory_gib=torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
            pack_members=part.pack_members,
            spread={k: v for k, v in scores.items() if M.is_spread(k)},
            system=part.system,
        )
        self.history.append(record.as_dict())
        stop = self.stopper.should_stop or (ends_epoch and epoch == config.train.epochs)
        checkpoint = Checkpoint(
            config=config.flat(),
            epoch=epoch if ends_epoch else epoch - 1,
            step=0 if ends_epoch else steps.stop,
            seeds=[r.state() for r in self.replicates],
            early_stopping=self.stopper.state(),
            history=self.history,
            finished=stop,
            patience_spent=self.stopper.should_stop,
            token_ids=torch.from_numpy(splits.token_ids),
            samples=reconstruct(first.model, splits, dev) if improved else None,
        )
        return record, checkpoint


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
    pack_members: int | None  # a sweep's pack's size (members); None outside one
    system: dict[str, float]  # the machine's use over the part (measure), every run's


@dataclass(frozen=True)
class MemberResult:
    """A pack member's result of one validation (:func:`seqae_core.members.train_members`)."""

    index: int  # the member's place in the configs
    record: EpochRecord | None  # this validation's, as train()'s report gets it; None when it failed
    checkpoint: Checkpoint | None  # as train()'s report gets it; None when it failed
    error: str | None = None  # why it failed: "NonFiniteLossError: training loss is not finite at epoch 2, step 5"


PackReport = Callable[[list[MemberResult]], set[int]]  # returns the indices of the members that must leave now


def train_runs(
    runs: list[Run],
    splits: data_lib.Splits,
    dev: torch.device,
    plan: HeadPlan,
    steps_per_epoch: int,
    checks: list[int],
    report: PackReport,
    *,
    fused: bool,
    members: bool,
    data_seconds: float,
    progress: bool,
    measure: Callable[[], dict[str, float]] | None,
    interrupt: Interrupt | None = None,
) -> None:
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
            labels = [
                f" seed {r.seed}" if run.config.train.repeats > 1 else "" for run in trained for r in run.replicates
            ]
            with replicates[0].drawing(dev):  # the pack's dropout masks, all members' from the first's stream
                losses, curves, errors = train_pack_steps(
                    pack,
                    replicates,
                    labels,
                    splits,
                    shared,
                    dev,
                    epoch,
                    steps,
                    steps_per_epoch,
                    progress,
                    fail_fast=not members,
                    interrupt=interrupt,
                )
            pack.unstack(
                [r.model for r in replicates], [r.optimizer for r in replicates], [r.scheduler for r in replicates]
            )
        else:
            losses, curves = [], []
            for run in trained:
                for replicate in run.replicates:
                    with replicate.drawing(dev):
                        loss, curve = train_steps(
                            replicate, splits, run.config, dev, epoch, steps, steps_per_epoch, progress, interrupt
                        )
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
        for _, run, _, error in outcomes:
            scoring_cpu_start = time.process_time()
            scored.append(None if error else (*run.score(splits, dev, plan), time.process_time() - scoring_cpu_start))
        n = len(trained)
        part = Part(
            epoch,
            steps,
            steps_per_epoch,
            train_seconds,
            (time.perf_counter() - part_start) / n,
            (time.process_time() - part_cpu_start) / n,
            data_seconds,
            n if members else None,
            measure() if measure is not None else {},
        )
        results = []
        for (index, run, where, error), scores in zip(outcomes, scored):
            if scores is None:
                run.error = error
                results.append(MemberResult(index, None, None, f"{NonFiniteLossError.__name__}: {error}"))
                continue
            record, checkpoint = run.record(
                part, losses[where], curves[where], scores[0], scores[1], scores[2], splits, dev
            )
            results.append(MemberResult(index, record, checkpoint))
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
    pack = Pack(
        [r.model for _, r in replicates],
        lr=[c.train.lr for c, _ in replicates],
        weight_decay=[c.train.weight_decay for c, _ in replicates],
        schedule=[lr_schedule(c.train, steps_per_epoch, c.data.input_len) for c, _ in replicates],
        plan=plan,
        autocast=lambda: autocast(runs[0].config, dev),
        pad_id=splits.pad_id,
        device=dev,
    )
    pack.stack(
        [r.model for _, r in replicates], [r.optimizer for _, r in replicates], [r.scheduler for _, r in replicates]
    )
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
) -> Summary:
    """Train and return the final metrics (those of the best epoch, plus a summary).

    ``resume`` is a checkpoint dict from ``report``; training continues after its epoch. Its
    config must be ``config`` but for ``train.epochs``: a run that reached its last epoch, given
    more, trains on (with its optimizer, schedule and patience as they were); one whose patience
    ran out stays stopped. ``published``: where a sweep's driver published the data
    (``seqae_core.data.publish``), to fetch it into ``cache_dir`` rather than tokenize it.
    ``measure``: called at the end of every epoch; what it returns (``system/`` names) joins the epoch's record (a
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
            if report is not None and result.record is not None and result.checkpoint is not None:
                report(result.record, result.checkpoint)
        return set()

    train_runs(
        [run],
        splits,
        dev,
        plan,
        steps_per_epoch,
        checks,
        forward,
        fused=fuses(config, dev),
        members=False,
        data_seconds=data_seconds,
        progress=progress,
        measure=measure,
        interrupt=interrupt,
    )
    return run.summary(data_seconds)


def load_data(
    config: Config, dev: torch.device, cache_dir: Any, published: str | None
) -> tuple[data_lib.Splits, float]:
    """The run's data (``seqae_core.data.load``) and the seconds it took, with ``dev`` set up to train."""
    set_up(dev)
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


def summary(history: list[Scores], stopper: EarlyStopping, epochs: int, data_seconds: float) -> Summary:
    """The final metrics: those of the best result (the best epoch's by default), and how the run went."""
    numbers = [{k: v for k, v in h.items() if not isinstance(v, list)} for h in history]  # not train_loss_steps
    best = numbers[stopper.best_epoch - 1]
    train_seconds = sum(h[M.EPOCH_SECONDS] for h in numbers)
    return {
        **{
            k: best[k]
            for k in (
                M.VAL_TOKEN_ACCURACY,
                M.VAL_LOSS,
                M.VAL_SEQUENCE_ACCURACY,
                M.TRAIN_LOSS,
                M.LATENT_FRACTION,
                M.LATENT_FLOATS,
                M.LATENT_SHARE,
                *M.TEST_METRICS,
            )
            if k in best
        },
        **{k: v for k, v in best.items() if M.is_spread(k)},
        M.BEST_EPOCH: best[M.EPOCH],
        M.EPOCHS_RUN: numbers[-1][M.EPOCH],  # whole unless patience stopped it between epochs' ends
        M.STOPPED_EARLY: numbers[-1][M.EPOCH] < epochs,
        M.TOKENS_PER_S: float(np.mean([h[M.TOKENS_PER_S] for h in numbers])),
        M.TRAIN_SECONDS: train_seconds,
        M.DATA_SECONDS: data_seconds,
        **({M.COMPILE_SECONDS: numbers[0][M.COMPILE_SECONDS]} if M.COMPILE_SECONDS in numbers[0] else {}),
    }
