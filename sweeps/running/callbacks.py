"""Tune's callbacks on the driver: each trial's events handed to MLflow through the
:class:`~sweeps.stores.writer.Writer`, to the progress lines, and to the people notified."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.experiment import Trial

from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.borders import TuneResult
from sweeps.running.notify import Notifier
from sweeps.running.progress import Progress, best_line
from sweeps.running.slots import Slots
from sweeps.running.stoppers import DriverOnly, Spend, StopNow, TrialStops
from sweeps.running.tune_result import of_tune
from sweeps.spec.trial import WorkerSpec
from sweeps.stores import ledger
from sweeps.stores.search import SweepStudy
from sweeps.stores.tracking import Tracker
from sweeps.stores.writer import Writer

log = logging.getLogger(__name__)
MEMBER_ERROR = "member_error"  # a pack's member that failed alone: its error, in its stand-in trial's config
PACK_TUNE_ID = "pack_tune_id"  # a pack's member: the Tune trial that trains it (its pack), in its stand-in's config


class SlotsCallback(DriverOnly, tune.Callback):
    """Keeps the sweep's seat in the cluster's queue: at each step of Tune's loop (at most every few
    seconds) it tells the queue what the sweep's trials do and reads the sweep's share again."""

    def __init__(self, slots: Slots, searcher: Any) -> None:
        self.slots, self.searcher = slots, searcher  # the StudySearcher (sweeps.running.runner)

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if not self.slots.due():
            return
        by_status = [t.status for t in trials]
        self.slots.update(
            self.searcher.doing(
                by_status.count(Trial.RUNNING), by_status.count(Trial.PENDING), by_status.count(Trial.PAUSED)
            )
        )


class TrackingCallback(DriverOnly, tune.Callback):
    """Hands Tune's trial events to the MLflow writer."""

    def __init__(self, tracker: Tracker, writer: Writer, study: SweepStudy) -> None:
        self.tracker, self.writer, self.study = tracker, writer, study

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        spec = WorkerSpec.of_tune(trial.config).trial
        self.writer.submit(
            f"starting trial {spec.number}",
            lambda: self.tracker.trial_started(
                spec.number,
                spec.logged_params,
                trial.config.get(PACK_TUNE_ID, trial.trial_id),
                spec.continued,
                None if spec.config is None else spec.config.data,
                spec.start,
            ),
        )

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: TuneResult, **info: Any
    ) -> None:
        number, kept = WorkerSpec.of_tune(trial.config).trial.number, of_tune(result)
        self.writer.submit(
            f"logging trial {number}", lambda: self.tracker.trial_result(number, kept.record, kept.node, kept.gpu)
        )

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        number = WorkerSpec.of_tune(trial.config).trial.number
        if trial.num_failures == 0:  # a node that was leaving (SIGTERM, a drain): Tune spends no retry on it
            log.warning(
                "trial %d left a node that was going away (no retry spent); it continues from its checkpoint", number
            )
        else:
            log.warning(
                "trial %d lost its worker (failure %d); it continues from its checkpoint", number, trial.num_failures
            )

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._ended(trial, None)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._ended(trial, last_error(trial))

    def _ended(self, trial: Trial, error: str | None) -> None:
        number = WorkerSpec.of_tune(trial.config).trial.number
        try:
            outcome = ledger.Outcome(self.study.state(number).name)
        except Exception:  # noqa: BLE001 - tracking must never stop the sweep; the next resume reconciles
            log.exception("cannot read the Optuna state of trial %d; MLflow will be reconciled on resume", number)
            return
        self.writer.submit(f"closing trial {number}", lambda: self.tracker.trial_ended(number, outcome, error))
        if self.study.spec.multi_objective:  # a front has no one best to chart
            return
        try:
            trials = self.study.trials()
            best, ended = self.study.best(trials), sum(t.state.is_finished() for t in trials)
        except Exception:  # noqa: BLE001 - as above: a chart point is not worth stopping the sweep for
            log.exception("cannot read the best trial after trial %d; its chart point is skipped", number)
            return
        if best:
            values = {self.study.spec.objectives[0].metric: float(best[0].values[0])}
            test = best[0].user_attrs.get(N.TEST, {}).get(M.TEST_TOKEN_ACCURACY)
            values |= {M.TEST_TOKEN_ACCURACY: float(test)} if test is not None else {}
            self.writer.submit("recording the best so far", lambda: self.tracker.best_so_far(ended, values))


class ProgressCallback(DriverOnly, tune.Callback):
    """Hands Tune's trial events to the sweep's :class:`~sweeps.running.progress.Progress` lines."""

    def __init__(
        self, progress: Progress, spend: Spend, stop_now: StopNow, trial_stops: TrialStops | None = None
    ) -> None:
        self.progress, self.spend, self.stop_now, self.trial_stops = progress, spend, stop_now, trial_stops

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: TuneResult, **info: Any
    ) -> None:
        spec = WorkerSpec.of_tune(trial.config).trial
        self.progress.result(spec.number, spec.params, of_tune(result).record, spec.start)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        number = WorkerSpec.of_tune(trial.config).trial.number
        finished = (trial.last_result or {}).get("finished", False)
        self.progress.ended(
            number,
            _epochs(trial),
            "finished"
            if finished
            else "stopped by the budget"
            if number in self.spend.stopped
            else "stopped by `seqae sweep stop --now`"
            if number in self.stop_now.halted
            else "stopped by `seqae sweep stop --trial`"
            if self.trial_stops and number in self.trial_stops.stopped
            else "stopped by the scheduler",
        )

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.progress.ended(WorkerSpec.of_tune(trial.config).trial.number, _epochs(trial), "failed", last_error(trial))


class NotifyCallback(DriverOnly, tune.Callback):
    """Tells the sweep's :class:`~sweeps.running.notify.Notifier` of a new best trial and of a failed one
    (the searcher has recorded a trial's outcome in the study before Tune's callbacks hear of it)."""

    def __init__(self, notifier: Notifier, study: SweepStudy) -> None:
        self.notifier, self.study = notifier, study
        self.best = self._best()

    def _best(self) -> int | None:
        best = self.study.best()
        return best[0].number if len(best) == 1 else None

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        best = self._best()
        if best is not None and best != self.best:
            self.best = best
            line = best_line(self.study.best(), self.study.spec.objectives)
            self.notifier.send("best", f"a new best, trial {best}", line)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        number = WorkerSpec.of_tune(trial.config).trial.number
        self.notifier.send("failed", f"trial {number} failed", last_error(trial)[-1000:])


def _epochs(trial: Trial) -> float:
    return float((trial.last_result or {}).get(M.EPOCH, 0))


def last_error(trial: Trial) -> str:
    """The last line of the trial's latest error ("NonFiniteLossError: ..."), read from the
    trial's local error file: Tune writes it before calling back, whereas the copy in the
    storage path may not be synced yet. A pack's member that failed alone carries its own."""
    if error := trial.config.get(MEMBER_ERROR):  # sweeps.running.packs
        return str(error)
    path = trial.error_file
    text = Path(path).read_text(errors="replace") if path and Path(path).exists() else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "the trial failed (Tune recorded no error text)"
