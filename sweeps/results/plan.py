"""`seqae sweep plan`: what a sweep will take, forecast before anything runs.

On this machine it measures a training step and a validation of every shape the sweep's trials
can take (its grid cells and the choices of its searched keys that are not learning-rate-like,
:data:`seqae_core.config.FREE_KEYS`; a numeric key at the middle of its range), each with a
trial's CPU threads and the sweep's own data (prepared into the workspace's cache, as the sweep
would prepare it): an epoch is ``ceil(train samples / batch)`` steps and its validations, each
with the test split's scoring where there is one. The trials' expected epochs under the
scheduler and their wall time at the slots the sweep would get come from
:mod:`sweeps.results.eta`'s arithmetic: the slots are ``max_concurrent`` at most, and what the
caller says a cluster gives (``--slots``), else the share the cluster's queue would give the sweep
if it joined now, at its priority and weight, within its user's quota (:func:`queue_slots`), else
what this machine's CPUs or GPUs hold; the forecast says which. The forecast counts
epochs only: a trial's start (its Ray worker, its data), checkpoints and MLflow come on top, and
the running sweep's ETA (:func:`sweeps.results.eta.eta`) measures them."""

from __future__ import annotations

import io
import itertools
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sqlalchemy as sa
import torch

from seqae_core import data as data_lib
from seqae_core import metrics as M
from seqae_core.config import FREE_KEYS, Config, build
from seqae_core.device import pick_device
from seqae_core.evaluation import evaluate
from seqae_core.loops import Replicate
from seqae_core.loss import plan_head
from seqae_core.train import validation_steps
from seqae_errors import ConfigError
from sweeps.results.eta import expected_epochs, wall_seconds
from sweeps.spec.sections import Distribution
from sweeps.spec.sweep import SweepSpec, trial_layers
from sweeps.stores.ownership import actor
from sweeps.stores.queue import Queue
from sweeps.stores.shares import Claim

MAX_SHAPES = 8  # shapes timed at most; beyond, a random draw of them (seed 0)
ORDERED_LEVELS = 4  # an int key with this many values or fewer on its step is timed at each, as a choice


def median_step_seconds(step: Callable[[], None], steps: int) -> float:
    """Median seconds per step after two warm-up steps."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        sync()
        started = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


@dataclass(frozen=True)
class Shape:
    """One shape of a sweep's trials, measured on this machine."""

    params: dict[str, object]  # the shape-setting values it was timed at
    parameters: int  # the model's
    step_seconds: float  # one training step of train.batch_size samples
    epoch_seconds: float  # the steps of an epoch and its validations
    validations: int  # an epoch's
    checkpoint_bytes: int  # an epoch record (model and optimizer) and a best-model record (model)
    metric_rows_per_epoch: int  # MLflow metric rows an epoch adds: its metrics and the loss curve's points


@dataclass(frozen=True)
class Forecast:
    """`seqae sweep plan`: what a sweep will take, before it runs (the module's docstring)."""

    trials: int
    starts: int  # of which starting points, trained to the end
    scheduler: str
    max_epochs: int
    epochs_per_trial: float  # expected, a proposed trial's
    epochs: float  # expected, every trial's
    shapes: tuple[Shape, ...]
    device: str
    unit: str  # cpu-hours or gpu-hours
    resource_hours: float
    slots: int
    slots_from: str  # what set them
    wall_seconds: float
    checkpoint_bytes: int  # the keep_best trials' checkpoints at the end, the largest shape's
    mlflow_runs: int
    mlflow_metric_rows: int
    optuna_intermediate_rows: int  # one per validation

    def lines(self) -> list[str]:
        hours = self.wall_seconds / 3600
        return [
            f"trials: {self.trials} ({self.starts} starting point{'' if self.starts == 1 else 's'}, trained to the end)",
            f"epochs: {self.scheduler}, {self.epochs_per_trial:.2f} expected per proposed trial of at most "
            f"{self.max_epochs}; {self.epochs:.1f} in all",
            *(
                f"shape {shape_text(s.params)}: {s.parameters:,} parameters, step {s.step_seconds * 1000:.1f} ms, "
                f"epoch {s.epoch_seconds:.1f} s on this {self.device}"
                for s in self.shapes
            ),
            f"{self.unit}: {self.resource_hours:.3g}",
            f"wall time at {self.slots} slots ({self.slots_from}): {self.wall_seconds:.0f} s ({hours:.2f} h), "
            "epochs only (trial start-up, checkpoints and MLflow come on top)",
            f"disk: {self.checkpoint_bytes / 1e6:.1f} MB of checkpoints kept at the end (checkpoints.keep_best trials)",
            f"MLflow: {self.mlflow_runs} runs, {self.mlflow_metric_rows:,} metric rows; "
            f"Optuna: {self.trials} trials, {self.optuna_intermediate_rows:,} intermediate values",
        ]


def shape_text(params: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "(the base config)"


def _middle(distribution: Distribution) -> object:
    """A numeric searched key's value for timing: the middle of its range (on a log scale where it samples so)."""
    assert distribution.low is not None and distribution.high is not None
    log = distribution.type == "loguniform" or distribution.log
    middle = math.sqrt(distribution.low * distribution.high) if log else (distribution.low + distribution.high) / 2
    return round(middle) if distribution.type == "int" else middle


def _timed(distribution: Distribution) -> tuple[object, ...]:
    """A searched key's values to time: a categorical's or an ordered key's choices; an int's values
    where its step leaves few (widths declared as int with a step); else the middle of its range, on its step."""
    if distribution.type in ("categorical", "ordered"):
        return tuple(distribution.choices)
    if distribution.type == "int" and distribution.step:
        assert distribution.low is not None and distribution.high is not None
        levels = range(int(distribution.low), int(distribution.high) + 1, distribution.step)
        middle = (levels[0] + levels[-1]) / 2
        return tuple(levels) if len(levels) <= ORDERED_LEVELS else (min(levels, key=lambda v: abs(v - middle)),)
    return (_middle(distribution),)


def shapes_of(spec: SweepSpec) -> list[dict[str, object]]:
    """The shape-setting values a sweep's trials can take: every grid cell with every combination
    of its searched keys' values (:func:`_timed`), the free keys left at the base; at most
    :data:`MAX_SHAPES`, drawn at random (seed 0) beyond."""
    timed = {k: d for k, d in spec.search.items() if k not in FREE_KEYS}
    values = [_timed(d) for d in timed.values()]
    shapes: list[dict[str, object]] = []
    for cell in spec.cells():
        for combination in itertools.product(*values):
            chosen = dict(zip(timed, combination))
            params: dict[str, object] = dict(cell)
            for key in spec.sampling_order():  # a conditional key only where its condition holds
                if key in chosen and spec.search[key].active({**cell, **params}):
                    params[key] = chosen[key]
            if params not in shapes:
                shapes.append(params)
    if len(shapes) > MAX_SHAPES:
        picks = np.random.default_rng(0).choice(len(shapes), MAX_SHAPES, replace=False)
        shapes = [shapes[i] for i in sorted(picks)]
    return shapes


def measure(params: dict[str, object], config: Config, cache_dir: Path, steps: int = 3) -> Shape:
    """Shape ``params`` (whose config is ``config``) on this machine: a training step's seconds and
    an epoch's (its steps and validations), its parameters, its checkpoints' bytes and its rows."""
    dev = pick_device(None)
    plan = plan_head(config.train.head, dev)
    splits = data_lib.load(config.data, cache_dir)
    steps_per_epoch = math.ceil(len(splits.train) / config.train.batch_size)
    replicate = Replicate.create(
        config, config.train.seed, splits.vocab_size, dev, steps_per_epoch, plan, splits.pad_id
    )
    batch = splits.batch(splits.train[: config.train.batch_size])
    step_s = median_step_seconds(lambda: replicate.step(batch), steps)
    started = time.perf_counter()
    evaluate(replicate.model, splits, splits.val, config, dev, plan)
    if len(splits.test):  # the test split is scored whenever the kept checkpoint improves: counted at every validation
        evaluate(replicate.model, splits, splits.test, config, dev, plan)
    validation_s = time.perf_counter() - started
    validations = len(validation_steps(config.train, steps_per_epoch))
    record, best = io.BytesIO(), io.BytesIO()
    torch.save({"model": replicate.model.state_dict(), "optimizer": replicate.optimizer.state_dict()}, record)
    torch.save(replicate.model.state_dict(), best)
    curve = math.ceil(steps_per_epoch / config.train.log_every_steps)  # the loss curve's points
    return Shape(
        params,
        sum(p.numel() for p in replicate.model.parameters()),
        step_s,
        steps_per_epoch * step_s + validations * validation_s,
        validations,
        len(record.getvalue()) + len(best.getvalue()),
        validations * _metric_rows(config, dev) + curve,
    )


def _metric_rows(config: Config, dev: torch.device) -> int:
    """MLflow metric rows a validation adds: the per-epoch metrics (and the test ones with a test split)."""
    return (
        len(M.PER_EPOCH)
        + (len(M.CUDA_PER_EPOCH) if dev.type == "cuda" else 0)
        + (len(M.TEST_METRICS) if config.data.test_fraction > 0 else 0)
    )


def _shape_of(params: Mapping[str, object], shapes: list[Shape], otherwise: Shape) -> Shape:
    """The timed shape whose values ``params`` takes (a starting point's), else ``otherwise``."""
    return next((s for s in shapes if all(params.get(k) == v for k, v in s.params.items())), otherwise)


def capacity(spec: SweepSpec) -> tuple[int, str]:
    """Trials this machine holds at once: its GPUs over ``resources.gpu``, else its CPUs over ``resources.cpu``."""
    if spec.resources.gpu > 0:
        gpus = torch.cuda.device_count()
        return int(gpus // spec.resources.gpu), f"{gpus} GPUs here / {spec.resources.gpu:g} per trial"
    cpus = os.cpu_count() or 1
    return max(1, int(cpus // spec.resources.cpu)), f"{cpus} CPUs here / {spec.resources.cpu:g} per trial"


def queue_slots(spec: SweepSpec, url: str) -> tuple[int, str] | None:
    """The trials the cluster's queue at ``url`` (an Optuna storage URL) would let the sweep run
    at once if it joined now, at its priority and weight and within its user's quota, and what
    set them; None where no sweep has run on that database (the queue knows no capacity), or it
    does not answer."""
    path = sa.make_url(url).database if url.startswith("sqlite:") else None
    if path is not None and not Path(path).exists():  # a workspace that never ran a sweep: no queue to ask
        return None
    trials = spec.planned_trials()
    claim = Claim(
        "(planned)",
        actor(),
        spec.priority or 0,
        min(spec.max_concurrent, trials),
        spec.resources.cpu,
        spec.resources.gpu,
        spec.weight or 1.0,
        time.time(),
    )
    try:
        found = Queue(url, create=False).would_grant(claim)
    except sa.exc.SQLAlchemyError:
        return None
    if found is None:
        return None
    share, cluster = found
    gpus = f" and {cluster.gpus:g} GPUs" if cluster.gpus else ""
    why = f", {share.why}" if share.why else ""
    return share.slots, (
        f"the cluster's queue now: {share.slots} of {cluster.cpus:g} CPUs{gpus} at priority {claim.priority}{why}"
    )


def forecast(spec: SweepSpec, cache_dir: Path, slots: int | None = None, queue_url: str | None = None) -> Forecast:
    """The forecast of the module's docstring; ``slots``: trials at once on the cluster that will
    run it, else the share the queue at ``queue_url`` would give it now, else what this machine
    holds; ``max_concurrent`` at most."""
    if slots is not None and slots < 1:
        raise ConfigError(f"--slots {slots}: a sweep needs at least 1 trial slot")
    if spec.resources.gpu > 0 and not torch.cuda.is_available():  # a CPU's step times say nothing of a GPU's
        raise ConfigError(
            f"resources.gpu={spec.resources.gpu:g}: this machine has no GPU to time the trials' "
            "steps on; run plan on a machine with the GPU the sweep will use"
        )
    threads = torch.get_num_threads()
    if spec.resources.gpu == 0:
        torch.set_num_threads(max(1, int(spec.resources.cpu)))  # as a trial's worker has them
    try:
        shapes = []
        for params in shapes_of(spec):
            shapes.append(measure(params, build(trial_layers(spec.source, spec.base, params)), cache_dir))
    finally:
        torch.set_num_threads(threads)
    base = build(trial_layers(spec.source, spec.base, {}))
    max_t = base.train.epochs
    trials = spec.planned_trials()
    starts = min(len(spec.start), trials)
    per_trial = expected_epochs(spec.scheduler, max_t)
    mean_epoch_s = float(np.mean([s.epoch_seconds for s in shapes]))
    widest = max(shapes, key=lambda s: s.epoch_seconds)
    start_s = [max_t * _shape_of(spec.start_params(name), shapes, widest).epoch_seconds for name in spec.start][:starts]
    trial_seconds = start_s + [per_trial * mean_epoch_s] * (trials - starts)
    queued = queue_slots(spec, queue_url) if slots is None and queue_url else None
    given, given_from = (slots, f"--slots {slots}") if slots is not None else queued or capacity(spec)
    at = max(1, min(spec.max_concurrent, trials, given))
    source = f"max_concurrent {spec.max_concurrent}, {given_from}" + (
        "; it would wait for a slot, timed at 1" if given == 0 else ""
    )
    unit, share = spec.share
    epochs = starts * max_t + (trials - starts) * per_trial
    mean_rows = float(np.mean([s.metric_rows_per_epoch for s in shapes]))
    validations = float(np.mean([s.validations for s in shapes]))
    return Forecast(
        trials=trials,
        starts=starts,
        scheduler=spec.scheduler.label,
        max_epochs=max_t,
        epochs_per_trial=per_trial,
        epochs=epochs,
        shapes=tuple(shapes),
        device=str(pick_device(None)),
        unit=f"{unit}-hours",
        resource_hours=sum(trial_seconds) * share / 3600,
        slots=at,
        slots_from=source,
        wall_seconds=wall_seconds(trial_seconds, at),
        checkpoint_bytes=min(spec.checkpoints.keep_best, trials) * widest.checkpoint_bytes,
        mlflow_runs=trials + 1,
        mlflow_metric_rows=round(epochs * mean_rows + trials),  # + each trial's cost, once
        optuna_intermediate_rows=round(epochs * validations),
    )
