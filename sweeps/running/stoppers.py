"""Tune's stoppers on the driver: the sweep's budget (its resource-seconds, all sessions, kept to
within one epoch), `seqae sweep stop --now` (read from the study's control record at every
result) and `seqae sweep stop --trial` (from the trial's record); and what Tune may keep of the
driver's objects (nothing: :class:`DriverOnly`)."""

from __future__ import annotations

import time
from typing import Any

from ray import tune
from ray.tune.experiment import Trial

from seqae_core.borders import PickleState, TuneResult
from seqae_core.epoch import EpochRecord
from seqae_core.records import RecordStore, TrialProgress
from sweeps.running.tune_result import of_tune
from sweeps.spec.sweep import SweepSpec
from sweeps.spec.trial import TRIAL, WorkerSpec
from sweeps.stores import ledger
from sweeps.stores.search import SweepStudy


class DriverOnly:
    """Each session starts a fresh Tuner and the study holds the state, so Tune's own copies
    (tuner.pkl, searcher checkpoints) carry nothing: the live handles cannot be pickled anyway."""

    def __getstate__(self) -> PickleState:
        return {}


class Spend:
    """The resource-seconds a sweep's trials have spent, all sessions: each epoch counted once,
    whichever of Tune's hooks hands it over first; and what the running trials are about to spend,
    so that the budget is kept to within one epoch rather than overshot by every epoch in progress."""

    def __init__(self, share: float, spent: float = 0.0, epochs: int = 0) -> None:
        self.share, self.total, self.before = share, spent, spent  # before: earlier sessions' spend
        self.epochs_before = epochs  # how many epochs earlier sessions paid for
        self.counted: set[tuple[int, int]] = set()  # this session's epochs
        # a running trial's latest epoch cost, what its next one should cost; a trial that has not
        # reported yet is priced at a typical epoch
        self.running: dict[int, float] = {}
        self.stopped: set[int] = set()  # the trials the budget stopped

    def started(self, number: int) -> None:
        self.running.setdefault(number, self.typical())

    def add(self, number: int, record: EpochRecord) -> None:
        if (number, record.validation) not in self.counted:  # each validation's seconds since the previous
            self.counted.add((number, record.validation))
            cost = self.share * record.epoch_seconds
            self.total += cost
            self.running[number] = cost

    def ended(self, number: int) -> None:
        self.running.pop(number, None)

    def committed(self) -> float:
        """Spent, plus one more epoch of every running trial at its latest epoch's cost."""
        return self.total + sum(self.running.values())

    def typical(self) -> float:
        """An epoch's mean cost in this session, else in the earlier ones (0 before any epoch)."""
        if self.counted:
            return (self.total - self.before) / len(self.counted)
        return self.before / self.epochs_before if self.epochs_before else 0.0

    def exhausted(self, seconds: float, starting: bool = False) -> bool:
        """Whether ``seconds`` cannot pay one more epoch of every running trial (and, ``starting``,
        the first epoch of a new trial, at a typical epoch's cost)."""
        return self.committed() + (self.typical() if starting else 0.0) > seconds

    def cannot_start(self, hours: float, unit: str) -> str | None:
        """Why no new trial may start, if a budget of ``hours`` cannot pay its first epoch."""
        return self.describe(hours, unit) if self.exhausted(hours * 3600, starting=True) else None

    def describe(self, hours: float, unit: str) -> str:
        return (
            f"the budget of {hours:g} {unit}-hours is spent ({self.total / 3600:.4f} spent, "
            f"{self.committed() / 3600:.4f} with one more epoch of each running trial)"
        )


class BudgetStopper(DriverOnly, tune.Stopper):
    """Stops a running trial at the end of its epoch when the budget cannot pay one more epoch of
    it and of every other running trial (Tune asks a stopper before the scheduler and the searcher
    hear of a result): the budget holds while trials run, not only by starting no new ones, and a
    sweep ends within about one epoch of it."""

    def __init__(self, spend: Spend, seconds: float) -> None:
        self.spend, self.seconds = spend, seconds

    def __call__(self, trial_id: str, result: TuneResult) -> bool:
        trial = of_tune(result)
        number = trial.trial
        self.spend.add(number, trial.record)
        if self.spend.exhausted(self.seconds):
            self.spend.ended(number)
            self.spend.stopped.add(number)
            return True
        return False

    def stop_all(self) -> bool:
        return False


class StopNow(DriverOnly, tune.Stopper):
    """Stops each running trial at the end of its epoch once `seqae sweep stop --now` is in the
    study's control record: read at every result, so a user's command on any machine reaches the
    trials on every node within one epoch. The next session continues them from that epoch."""

    def __init__(self, study: SweepStudy) -> None:
        self.study = study
        self.halted: set[int] = set()

    def __call__(self, trial_id: str, result: TuneResult) -> bool:
        if self.study.control().now:
            self.halted.add(of_tune(result).trial)
            return True
        return False

    def stop_all(self) -> bool:
        return False


class TrialStops(DriverOnly, tune.Stopper):
    """`seqae sweep stop --trial N`: trial N stops at its next validation (read from its Optuna
    record at every result, as :class:`StopNow` reads the sweep's), keeping its best checkpoint.
    :meth:`sweep`, which Tune's loop calls on its every step (at most every :data:`EVERY_SECONDS`),
    stops the others: one that waits for a slot or is paused (it would report nothing to stop it
    at) through Tune at once, and with ``--now`` a training one before its next optimizer step, its
    worker told through its checkpoint store (:class:`sweeps.running.trial.Leaving`). Either way
    Tune ends it as a scheduler's stop does: the searcher records it
    (:func:`sweeps.stores.ledger.decide`, ``stopped``) and its slot is free for the sweep's next trial."""

    EVERY_SECONDS = 2.0

    def __init__(self, study: SweepStudy, storage: str) -> None:
        self.study, self.storage = study, storage
        self.stopped: set[int] = set()  # the trials a user stopped, this session
        self._read = 0.0

    def __call__(self, trial_id: str, result: TuneResult) -> bool:
        number = of_tune(result).trial
        if self.study.stop_asked(number) is not None:
            self.stopped.add(number)
            return True
        return False

    def stop_all(self) -> bool:
        return False

    def sweep(self, controller: Any) -> None:
        """Stop, through Tune's ``controller`` (a scheduler's), each trial asked to stop that Tune
        holds paused or waiting, or running with ``--now``. A pack (``resources.fuse``) is one Tune
        trial of several: its members stop at their next validation only."""
        if time.monotonic() - self._read < self.EVERY_SECONDS:
            return
        self._read = time.monotonic()
        for trial in controller.get_trials():
            if trial.status in (Trial.TERMINATED, Trial.ERROR) or TRIAL not in trial.config:
                continue
            hop = WorkerSpec.of_tune(trial.config)
            if hop.pack:
                continue
            spec = hop.trial
            asked = self.study.stop_asked(spec.number)  # the trials Tune holds: a few records, not the study
            if asked is None or spec.number in self.stopped:
                continue
            if trial.status != Trial.RUNNING:
                self.stopped.add(spec.number)
                controller.stop_trial(trial)
            elif asked.now:
                self.stopped.add(spec.number)
                RecordStore.of_trial(self.storage, spec.number).record_stop(asked.by)

    def ended(self, number: int) -> None:
        """Trial ``number`` ended: a stop asked of its worker is forgotten, so a later
        `extend --epochs` trains it on."""
        if number in self.stopped:
            RecordStore.of_trial(self.storage, number).clear_stop()


def trial_progresses(study: SweepStudy, storage: str) -> dict[int, TrialProgress]:
    """How far each trial that trained got, from its checkpoint records."""
    found = RecordStore.progress_of(
        storage, [t.number for t in study.trials() if t.state.name in ("COMPLETE", "PRUNED", "RUNNING")]
    )
    return {number: progress for number, progress in found.items() if progress is not None}


def spent_so_far(spec: SweepSpec, progresses: dict[int, TrialProgress]) -> Spend:
    """What the trials spent in every session so far."""
    return Spend(
        spec.share[1],
        sum(ledger.resource_seconds(spec.share[1], p) for p in progresses.values()),
        sum(len(p.history) for p in progresses.values()),
    )


def budget_spent(spec: SweepSpec, study: SweepStudy, storage: str) -> bool:
    """Whether the sweep's budget cannot pay a new trial's first epoch: a resume would start none."""
    budget = spec.budget
    spend = spent_so_far(spec, trial_progresses(study, storage))
    return budget is not None and spend.cannot_start(budget.hours, budget.unit) is not None
