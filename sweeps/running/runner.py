"""Ray Tune for a sweep, on the driver: the searcher over the sweep's Optuna study, and one
session's Tuner, with the :mod:`~sweeps.running.stoppers`, :mod:`~sweeps.running.schedulers` and
:mod:`~sweeps.running.callbacks` it runs with.

The searcher asks :class:`~sweeps.stores.search.SweepStudy` for trials (a
:class:`~sweeps.spec.trial.TrialSpec` crosses into Tune), holds ``max_concurrent`` (the sweep's
ceiling) and the drain from the study's control record, proposes no trial past the sweep's share of
the cluster's slots (:mod:`sweeps.running.slots`), and records each result as
:mod:`sweeps.stores.ledger` decides it.
"""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any

from ray import tune
from ray.tune.search import Searcher
from ray.tune.stopper import CombinedStopper

from seqae_core import metrics as M
from seqae_core.borders import TuneConfig, TuneResult
from seqae_core.checkpoint import CheckpointStore
from seqae_core.epoch import EpochRecord
from sweeps.running import ray_private as RP
from sweeps.running.callbacks import NotifyCallback, ProgressCallback, SlotsCallback, TrackingCallback
from sweeps.running.notify import Notifier
from sweeps.running.packs import Members, PackCallback, PackScheduler, PackSearcher, member_id, pack_name
from sweeps.running.progress import Progress, say
from sweeps.running.schedulers import Rungs, SharedFIFO, rungs_for
from sweeps.running.slots import EVERY_SECONDS, Doing, Slots
from sweeps.running.stoppers import (
    BudgetStopper,
    DriverOnly,
    Spend,
    StopNow,
    TrialStops,
    spent_so_far,
    trial_progresses,
)
from sweeps.running.trial import Runtime, evictable, run_pack, run_trial
from sweeps.running.tune_result import of_tune
from sweeps.spec.sweep import SweepSpec
from sweeps.spec.trial import TrialSpec, WorkerSpec
from sweeps.stores import ledger
from sweeps.stores.retention import Retention
from sweeps.stores.search import SweepStudy
from sweeps.stores.tracking import Tracker
from sweeps.stores.writer import Writer


def _keep_tunes_loop_turning() -> None:
    """While a sweep has no trial in Tune (none training, waiting or paused) and its searcher
    proposes none (its share of the cluster's slots is 0), Tune asks the searcher again every
    second for up to ten minutes within one step of its loop (``TuneController._update_trial_queue``,
    its ``timeout``): for that long it frees none of the slots its ended trials' workers hold and the
    sweep's seat in the queue does not beat, so a sweep of a higher priority waits on those slots
    and this one looks stopped. The step gives up after a beat's time instead."""
    RP.limit_searcher_wait(EVERY_SECONDS)


_keep_tunes_loop_turning()


class StudySearcher(DriverOnly, Searcher):
    """Asks the sweep's Optuna study for trials and tells it how they ended."""

    def __init__(
        self,
        spec: SweepSpec,
        study: SweepStudy,
        storage: str,
        spend: Spend,
        stop_now: StopNow,
        retention: Retention,
        notifier: Notifier | None = None,
        slots: Slots | None = None,
        trial_stops: TrialStops | None = None,
    ) -> None:
        objective = spec.objectives[0]
        super().__init__(metric=objective.metric, mode=objective.mode)
        self.spec, self.study, self.storage = spec, study, storage
        self.spend, self.stop_now, self.retention, self.notifier = spend, stop_now, retention, notifier
        self.slots = slots  # the sweep's share of the cluster's slots (None: the cluster is its own)
        self.trial_stops = trial_stops  # the trials users stopped by hand (`seqae sweep stop --trial`)
        self.plans: dict[str, TrialSpec] = {}
        self.live: set[str] = set()  # Tune trials started and not yet ended
        self.ceiling = spec.max_concurrent
        self.draining = False
        self.finished = False

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "w") as f:
            f.write("the searcher's state is the sweep's Optuna study\n")

    def restore(self, checkpoint_path: str) -> None:
        pass

    def suggest(self, trial_id: str) -> TuneConfig | None:
        """The next trial; None while ``max_concurrent`` trials run (the study's control record
        may change it at any time) or the sweep's share of the cluster's slots is taken; Tune's
        FINISHED once the sweep has no trial left, or none but new ones while it drains."""
        control = self.study.control()
        budget = self.spec.budget
        if budget and not control.drain and (why := self.spend.cannot_start(budget.hours, budget.unit)):
            # a resumed sweep whose earlier sessions spent its budget: resuming lifted its drain
            control = self.study.set_control(drain=why)
        if control.drain and not self.draining:
            self.draining = True
            running = "stop at the end of their epoch" if control.now else "finish"
            say(
                f"seqae: draining ({control.drain}): no new trials start; the running ones ({len(self.live)}) {running}"
            )
            if self.notifier:
                self.notifier.send(
                    "stopped", "no new trials start", f"{control.drain}; {len(self.live)} running trials {running}"
                )
        ceiling = control.max_concurrent or self.spec.max_concurrent
        if ceiling != self.ceiling:
            say(f"seqae: max_concurrent {self.ceiling} -> {ceiling}")
            self.ceiling = ceiling
        if len(self.live) >= (ceiling if self.slots is None else min(ceiling, self.slots.allowed)):
            return None
        fuse = self.spec.resources.fuse
        trials = (
            self.study.next_pack(fuse, new=not self.draining)
            if fuse > 1
            else [t for t in [self.study.next_trial(new=not self.draining)] if t is not None]
        )
        if not trials:
            self.finished = True
            return RP.search_finished()  # Tune's own sentinel, a str
        for trial in trials:  # a pack's members by their own ids (sweeps.running.packs)
            self.plans[trial_id if fuse == 1 else member_id(trial_id, trial.number)] = trial
            self.spend.started(trial.number)
            self.study.note_tune_trial(trial.number, trial_id)
        self.live.add(trial_id)
        return WorkerSpec(trials[0], tuple(trials) if fuse > 1 else ()).to_tune()

    def doing(self, training: int, waiting: int, paused: int) -> Doing:
        """What the sweep's Tune trials do, with the trials it could run now and those done."""
        remaining = self.study.remaining()
        left = training + waiting + paused if self.draining or self.finished else remaining
        return Doing(training, waiting, paused, min(self.ceiling, left), self.study.total - remaining, self.ceiling)

    def on_trial_result(self, trial_id: str, result: TuneResult) -> None:
        self._result(self.plans[trial_id].number, of_tune(result).record)

    def _result(self, number: int, record: EpochRecord) -> None:
        """An epoch's value to Optuna; the sweep drains once it reaches the objective's target
        within its constraints, or once its trials have spent its budget."""
        objective, budget = self.spec.objectives[0], self.spec.budget
        self.study.report(number, record.validation, record.value(objective.metric), record.epoch)
        self.spend.add(number, record)
        value = record.value(objective.metric)
        why = None
        meets = all(v <= 0.0 for v in self.spec.violations(record.as_dict()))
        if objective.reached(value) and meets:
            why = f"trial {number} reached {objective.metric} {value:.4f}, the target {objective.target}"
        elif budget:
            why = self.spend.cannot_start(budget.hours, budget.unit)
        if why and not self.study.control().drain:
            self.study.set_control(drain=why)

    def on_trial_complete(self, trial_id: str, result: TuneResult | None = None, error: bool = False) -> None:
        self.live.discard(trial_id)
        number = self.plans[trial_id].number
        if result and M.EPOCH in result and not error:
            # Tune hands a trial's last result (and one its scheduler stopped it on) only to this
            # hook, not to on_trial_result: without this, Optuna would miss that epoch's value.
            self._result(number, of_tune(result).record)
        self.spend.ended(number)
        progress = CheckpointStore.of_trial(self.storage, number).progress()
        outcome = ledger.decide(
            progress,
            error,
            self.study.epochs(number),
            number in self.spend.stopped,
            number in self.stop_now.halted,
            self.trial_stops is not None and number in self.trial_stops.stopped,
        )
        ledger.settle(self.study, number, outcome, progress)
        if self.trial_stops is not None:
            self.trial_stops.ended(number)
        self.retention.settle(number)


def tune_name(trial: tune.experiment.Trial) -> str:
    """A Tune trial's name and folder: ``trial-0003``, or a pack's (:func:`~sweeps.running.packs.pack_name`)."""
    spec = WorkerSpec.of_tune(trial.config)
    return pack_name(spec.pack) if spec.pack else f"trial-{spec.trial.number:04d}"


def run_session(
    spec: SweepSpec,
    study: SweepStudy,
    tracker: Tracker,
    writer: Writer,
    *,
    storage: str,
    cache_dir: str,
    published: dict[Any, str],
    session: int,
    epochs: int,
    verbose: bool = False,
    notifier: Notifier | None = None,
    slots: Slots | None = None,
) -> None:
    """One Tuner run over the trials the study still has to run, within the sweep's share of the
    cluster's ``slots`` (None: all of it). Progress shows a line per trial result; ``verbose``
    brings back Ray Tune's own status tables."""
    progresses = trial_progresses(study, storage)
    spend = spent_so_far(spec, progresses)
    retention = Retention(study, storage, spec.checkpoints.keep_best, progresses)
    retention.settle()
    stop_now, trial_stops = StopNow(study), TrialStops(study, storage)
    searcher = StudySearcher(spec, study, storage, spend, stop_now, retention, notifier, slots, trial_stops)
    objective = spec.objectives[0]
    scheduler: SharedFIFO | Rungs = SharedFIFO()
    continuing = study.continuing()
    if continuing:  # trials `seqae sweep extend` reopened train on past max_t, to limits of their own
        epochs = max(epochs, *continuing.values())
        if spec.scheduler.type != "none":
            say(
                f"seqae: trials {list(continuing)} train on to their new epoch limit; {spec.scheduler.label} stops "
                "no trial this session"
            )
    elif spec.scheduler.type != "none":
        asha = scheduler = rungs_for(spec, {n: p.history for n, p in progresses.items()}, epochs)
        for number in study.numbers(ledger.Outcome.RUNNING.optuna_state):
            if asha.stops(
                number, study.trial_spec(number).start is not None
            ):  # the rungs it passed before the driver died stop it
                say(f"seqae: trial {number}: ASHA's rungs, rebuilt from the trials' records, stop it")
                ledger.settle(study, number, ledger.Outcome.PRUNED, progresses.get(number))
                writer.submit(f"closing trial {number}", partial(tracker.trial_ended, number, ledger.Outcome.PRUNED))
    # Tune's newer console output prints a config box, a results path and a TensorBoard hint
    # whatever the verbosity; its classic reporter at verbosity 0 prints nothing.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "1" if verbose else "0")
    best = study.best()
    progress = Progress(
        study.study.study_name,
        objective,
        study.remaining() * epochs,
        epochs,
        (best[0].values[0], best[0].number) if len(best) == 1 else None,
    )
    fused = spec.resources.fuse > 1
    trainable = tune.with_resources(
        evictable(
            tune.with_parameters(run_pack if fused else run_trial, runtime=Runtime(storage, cache_dir, published))
        ),
        {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu},
    )
    stoppers: list[tune.Stopper] = [
        *([BudgetStopper(spend, spec.budget.hours * 3600)] if spec.budget else []),
        stop_now,
        trial_stops,
    ]
    callbacks: list[tune.Callback] = [
        TrackingCallback(tracker, writer, study),
        ProgressCallback(progress, spend, stop_now, trial_stops),
        *([NotifyCallback(notifier, study)] if notifier else []),
    ]
    scheduler.slots, scheduler.trial_stops = slots, trial_stops
    members = Members(searcher, scheduler, stoppers, callbacks, storage) if fused else None
    seat = [SlotsCallback(slots, searcher)] if slots else []
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            metric=None if members else objective.metric,
            mode=None if members else objective.mode,
            search_alg=PackSearcher(members) if members else searcher,
            scheduler=PackScheduler(members) if members else scheduler,
            num_samples=study.remaining(),
            # StudySearcher keeps to max_concurrent, which may change while the sweep runs; Tune's
            # own limit is only an upper bound, and lets that many trials wait for workers at once
            # (with none, Tune starts a custom searcher's trials one after another).
            max_concurrent_trials=max(1, study.remaining()),
            # A trial's process pays its imports (torch, Ray Tune, seqae) before its first step, most of
            # its start (measured: docs/explanation/performance.md, "The figures behind the code's
            # choices"): an ended trial's process trains the next one with the same resources.
            # Not where a node can be lost alone (a Ray bug: RP.may_reuse_actors).
            reuse_actors=RP.may_reuse_actors(),
            trial_name_creator=tune_name,
            trial_dirname_creator=tune_name,
        ),
        run_config=tune.RunConfig(
            name=f"session-{session:03d}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=f"{storage.rstrip('/')}/tune",
            failure_config=tune.FailureConfig(max_failures=spec.retries),
            # the budget's stopper first: it counts every epoch's cost, also the one a stop ends on
            stop=None if members else CombinedStopper(*stoppers),
            callbacks=[PackCallback(members), *seat] if members else [*callbacks, *seat],
            verbose=1 if verbose else 0,
        ),
    )
    try:
        tuner.fit()
    finally:
        progress.close()
    retention.settle()  # trials whose workers still held their checkpoints when they ended
    if line := retention.summary():
        say(f"seqae: {line}")
