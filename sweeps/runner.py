"""Ray Tune for a sweep, on the driver: the searcher, the scheduler and the callbacks.

This and :mod:`sweeps.trial` (the trial function, in its worker) are the modules that import
``ray.tune``. The adapters are thin: the searcher asks :class:`~sweeps.search.SweepStudy` for
trials (a :class:`~sweeps.trial_spec.TrialSpec` crosses into Tune) and records their outcomes as
:mod:`sweeps.ledger` decides them, and the callbacks hand events to the MLflow
:class:`~sweeps.writer.Writer`.
"""

from __future__ import annotations

import logging
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.search import Searcher
from ray.tune.stopper import CombinedStopper

from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.checkpoint import CheckpointStore
from seqae_core.pareto import behind
from seqae_core.records import RecordStore, TrialProgress
from sweeps import ledger
from sweeps.notify import Notifier
from sweeps.progress import Progress, best_line, say
from sweeps.retention import Retention
from sweeps.search import SweepStudy
from sweeps.trial_spec import TrialSpec
from sweeps.spec import Objective, SweepSpec
from sweeps.trial import run_trial
from sweeps.tracking import Tracker
from sweeps.writer import Writer

log = logging.getLogger(__name__)

class _DriverOnly:
    """Each session starts a fresh Tuner and the study holds the state, so Tune's own copies
    (tuner.pkl, searcher checkpoints) carry nothing: the live handles cannot be pickled anyway."""

    def __getstate__(self) -> dict[str, Any]:
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

    def add(self, number: int, result: dict[str, Any]) -> None:
        if (number, int(result[M.EPOCH])) not in self.counted:
            self.counted.add((number, int(result[M.EPOCH])))
            cost = self.share * float(result[M.EPOCH_SECONDS])
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
        return (f"the budget of {hours:g} {unit}-hours is spent ({self.total / 3600:.4f} spent, "
                f"{self.committed() / 3600:.4f} with one more epoch of each running trial)")


class BudgetStopper(_DriverOnly, tune.Stopper):
    """Stops a running trial at the end of its epoch when the budget cannot pay one more epoch of
    it and of every other running trial (Tune asks a stopper before the scheduler and the searcher
    hear of a result): the budget holds while trials run, not only by starting no new ones, and a
    sweep ends within about one epoch of it."""

    def __init__(self, spend: Spend, seconds: float) -> None:
        self.spend, self.seconds = spend, seconds

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        number = int(result["trial"])
        self.spend.add(number, result)
        if self.spend.exhausted(self.seconds):
            self.spend.ended(number)
            self.spend.stopped.add(number)
            return True
        return False

    def stop_all(self) -> bool:
        return False


class StopNow(_DriverOnly, tune.Stopper):
    """Stops each running trial at the end of its epoch once `seqae sweep stop --now` is in the
    study's control record: read at every result, so a user's command on any machine reaches the
    trials on every node within one epoch. The next session continues them from that epoch."""

    def __init__(self, study: SweepStudy) -> None:
        self.study = study
        self.halted: set[int] = set()

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if self.study.control().now:
            self.halted.add(int(result["trial"]))
            return True
        return False

    def stop_all(self) -> bool:
        return False


class StudySearcher(_DriverOnly, Searcher):
    """Asks the sweep's Optuna study for trials and tells it how they ended."""

    def __init__(self, spec: SweepSpec, study: SweepStudy, storage: str, spend: Spend, stop_now: StopNow,
                 retention: Retention, notifier: Notifier | None = None) -> None:
        objective = spec.objectives[0]
        super().__init__(metric=objective.metric, mode=objective.mode)
        self.spec, self.study, self.storage = spec, study, storage
        self.spend, self.stop_now, self.retention, self.notifier = spend, stop_now, retention, notifier
        self.plans: dict[str, TrialSpec] = {}
        self.live: set[str] = set()  # Tune trials started and not yet ended
        self.limit = spec.max_concurrent
        self.draining = False

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "w") as f:
            f.write("the searcher's state is the sweep's Optuna study\n")

    def restore(self, checkpoint_path: str) -> None:
        pass

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        """The next trial; None while ``max_concurrent`` trials run (the study's control record
        may change it at any time); Tune's FINISHED once the sweep has no trial left, or none but
        new ones while it drains."""
        control = self.study.control()
        budget = self.spec.budget
        if budget and not control.drain and (why := self.spend.cannot_start(budget.hours, budget.unit)):
            # a resumed sweep whose earlier sessions spent its budget: resuming lifted its drain
            control = self.study.set_control(drain=why)
        if control.drain and not self.draining:
            self.draining = True
            running = "stop at the end of their epoch" if control.now else "finish"
            say(f"seqae: draining ({control.drain}): no new trials start; the running ones "
                  f"({len(self.live)}) {running}")
            if self.notifier:
                self.notifier.send("stopped", "no new trials start", f"{control.drain}; {len(self.live)} running "
                                   f"trials {running}")
        limit = control.max_concurrent or self.spec.max_concurrent
        if limit != self.limit:
            say(f"seqae: max_concurrent {self.limit} -> {limit}")
            self.limit = limit
        if len(self.live) >= limit:
            return None
        trial = self.study.next_trial(new=not self.draining)
        if trial is None:
            return Searcher.FINISHED  # type: ignore[return-value]  # Tune's own sentinel, a str
        self.plans[trial_id] = trial
        self.live.add(trial_id)
        self.spend.started(trial.number)
        self.study.note_tune_trial(trial.number, trial_id)
        return {"trial": trial}

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self._result(self.plans[trial_id].number, result)

    def _result(self, number: int, result: dict[str, Any]) -> None:
        """An epoch's value to Optuna; the sweep drains once it reaches the objective's target
        within its constraints, or once its trials have spent its budget."""
        self.study.report(number, int(result[M.EPOCH]), result)
        self.spend.add(number, result)
        objective, budget = self.spec.objectives[0], self.spec.budget
        value = float(result[objective.metric])
        why = None
        meets = all(v <= 0.0 for v in self.spec.violations(result))
        if objective.reached(value) and meets:
            why = f"trial {number} reached {objective.metric} {value:.4f}, the target {objective.target}"
        elif budget:
            why = self.spend.cannot_start(budget.hours, budget.unit)
        if why and not self.study.control().drain:
            self.study.set_control(drain=why)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        self.live.discard(trial_id)
        number = self.plans[trial_id].number
        if result and M.EPOCH in result and not error:
            # Tune hands a trial's last result (and one its scheduler stopped it on) only to this
            # hook, not to on_trial_result: without this, Optuna would miss that epoch's value.
            self._result(number, result)
        self.spend.ended(number)
        progress = CheckpointStore.of_trial(self.storage, number).progress()
        outcome = ledger.decide(progress, error, self.study.epochs(number), number in self.spend.stopped,
                                number in self.stop_now.halted)
        ledger.settle(self.study, number, outcome, progress)
        self.retention.settle(number)


class TrackingCallback(_DriverOnly, tune.Callback):
    """Hands Tune's trial events to the MLflow writer."""

    def __init__(self, tracker: Tracker, writer: Writer, study: SweepStudy) -> None:
        self.tracker, self.writer, self.study = tracker, writer, study

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        spec: TrialSpec = trial.config["trial"]
        self.writer.submit(f"starting trial {spec.number}", lambda: self.tracker.trial_started(
            spec.number, spec.logged_params, trial.trial_id, spec.continued,
            None if spec.config is None else spec.config.data, spec.start))

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any) -> None:
        number, kept = trial.config["trial"].number, dict(result)
        self.writer.submit(f"logging trial {number}", lambda: self.tracker.trial_result(number, kept))

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        log.warning("trial %d lost its worker (failure %d); it continues from its checkpoint",
                    trial.config["trial"].number, trial.num_failures)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._ended(trial, None)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._ended(trial, last_error(trial))

    def _ended(self, trial: Trial, error: str | None) -> None:
        number = trial.config["trial"].number
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


class ProgressCallback(_DriverOnly, tune.Callback):
    """Hands Tune's trial events to the sweep's :class:`~sweeps.progress.Progress` lines."""

    def __init__(self, progress: Progress, spend: Spend, stop_now: StopNow) -> None:
        self.progress, self.spend, self.stop_now = progress, spend, stop_now

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any) -> None:
        spec: TrialSpec = trial.config["trial"]
        self.progress.result(spec.number, spec.params, result, spec.start)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        number = trial.config["trial"].number
        finished = (trial.last_result or {}).get("finished", False)
        self.progress.ended(number, _epochs(trial), "finished" if finished else
                            "stopped by the budget" if number in self.spend.stopped else
                            "stopped by `seqae sweep stop --now`" if number in self.stop_now.halted
                            else "stopped by the scheduler")

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.progress.ended(trial.config["trial"].number, _epochs(trial), "failed", last_error(trial))


class NotifyCallback(_DriverOnly, tune.Callback):
    """Tells the sweep's :class:`~sweeps.notify.Notifier` of a new best trial and of a failed one
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
        number = trial.config["trial"].number
        self.notifier.send("failed", f"trial {number} failed", last_error(trial)[-1000:])


class ResumableASHA(tune.schedulers.ASHAScheduler):
    """Ray's ASHA (or, with several ``brackets``, its asynchronous Hyperband), whose rungs live in
    the driver's memory only (ray-project/ray#30838), rebuilt from the trials' checkpoint records
    when a session starts: each trial of an earlier session counts at every rung it reached, and a
    continued trial keeps its place in them, so it is promoted or stopped as it would have been had
    the driver not died. (With trials running concurrently, which trials reached a rung before
    another is not recorded; the rebuilt rungs hold them all.) A trial's bracket is drawn from its
    number, with Ray's odds, so that it is the same in every session. It reads Ray's private
    ``_brackets``, ``_trial_info`` and ``_Bracket._rungs``; the ASHA test in tests/test_control.py
    fails if a Ray upgrade changes them."""

    def __init__(self, history: dict[int, list[dict[str, Any]]], objectives: tuple[Objective, ...],
                 **kwargs: Any) -> None:
        """``history``: each earlier trial's epoch records (its checkpoint records' results)."""
        super().__init__(**kwargs)
        self._objectives = objectives
        sizes = np.array([len(bracket._rungs) for bracket in self._brackets])
        odds = np.exp(sizes - sizes.max())  # Ray's: more trials to the brackets with more rungs
        self._odds = odds / odds.sum()
        for number, records in history.items():
            values = {int(record[M.EPOCH]): self.value(record) for record in records}
            for milestone, recorded in self.bracket_of(number)._rungs:
                if int(milestone) in values:
                    recorded[f"past-{number}"] = values[int(milestone)]

    def value(self, record: dict[str, Any]) -> Any:
        """What a rung records of an epoch's ``record``: the objective's value, turned to be
        maximized (Ray's ASHA records it so)."""
        return self._objectives[0].sign * float(record[self._objectives[0].metric])

    def behind(self, bracket: Any, others: dict[str, Any], mine: Any) -> bool:
        """Whether ``mine`` falls below the rung's cutoff among ``others`` (Ray's rule)."""
        cutoff = bracket.cutoff(others)
        return cutoff is not None and mine < cutoff

    def bracket_of(self, number: int) -> Any:
        """Trial ``number``'s bracket (Ray's ``_Bracket``)."""
        if len(self._brackets) == 1:
            return self._brackets[0]
        return self._brackets[int(np.random.default_rng(number).choice(len(self._brackets), p=self._odds))]

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> str:
        """ASHA's decision, except that a starting point always goes on: it is evaluated to the full
        budget (its values still count at each rung, as any trial's)."""
        decision = self.decide(tune_controller, trial, result)
        before_the_end = result.get(self._time_attr, 0) < self._max_t
        return tune.schedulers.TrialScheduler.CONTINUE if trial.config["trial"].start and before_the_end else decision

    def decide(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> str:
        return super().on_trial_result(tune_controller, trial, result)

    def stops(self, number: int, start: bool = False) -> bool:
        """Whether a continued trial falls below a cutoff at a rung it passed before the crash
        (a starting point never does: it runs to the full budget)."""
        if start:
            return False
        bracket = self.bracket_of(number)
        for _, recorded in reversed(bracket._rungs):  # lowest rung first
            mine = recorded.get(f"past-{number}")
            if mine is not None and self.behind(bracket, {k: v for k, v in recorded.items() if k != f"past-{number}"},
                                                mine):
                return True
        return False

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        super().on_trial_add(tune_controller, trial)
        number = trial.config["trial"].number
        bracket = self._trial_info[trial.trial_id] = self.bracket_of(number)
        for _, recorded in bracket._rungs:  # a continued trial's rungs passed are its own again
            if (value := recorded.pop(f"past-{number}", None)) is not None:
                recorded[trial.trial_id] = value


class ParetoASHA(ResumableASHA):
    """ASHA (or asynchronous Hyperband) over several objectives: a rung records each trial's
    objectives, every one turned to be maximized, and a trial reaching it goes on unless
    non-dominated sorting puts it behind the best 1 in ``reduction_factor`` of the trials recorded
    there and itself (:func:`seqae_core.pareto.behind`); a trial on the rung's front always goes on.
    Syne Tune's MO-ASHA ranks the same way and breaks ties in rank as well; here they go on
    together. Resumes as :class:`ResumableASHA` does."""

    def value(self, record: dict[str, Any]) -> Any:
        return tuple(o.sign * float(record[o.metric]) for o in self._objectives)

    def behind(self, bracket: Any, others: dict[str, Any], mine: Any) -> bool:
        return behind(list(others.values()), mine, 1 / bracket.rf)

    def decide(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> str:
        """Ray's ASHA step for a vector: at the end, stop; at the highest rung the trial reached and
        has no value at yet, record it there and go on unless it is behind."""
        if self._time_attr not in result:
            return tune.schedulers.TrialScheduler.CONTINUE
        if result[self._time_attr] >= self._max_t:
            return tune.schedulers.TrialScheduler.STOP
        return self._record(trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> None:
        if self._time_attr in result:
            self._record(trial, result)
        del self._trial_info[trial.trial_id]

    def _record(self, trial: Trial, result: dict[str, Any]) -> str:
        bracket, mine = self._trial_info[trial.trial_id], self.value(result)
        for milestone, recorded in bracket._rungs:  # the highest rung first
            if result[self._time_attr] >= milestone and trial.trial_id not in recorded:
                others = dict(recorded)
                recorded[trial.trial_id] = mine
                return (tune.schedulers.TrialScheduler.STOP if self.behind(bracket, others, mine)
                        else tune.schedulers.TrialScheduler.CONTINUE)
        return tune.schedulers.TrialScheduler.CONTINUE


def stub_trial(spec: TrialSpec) -> Trial:
    """A Tune trial that carries ``spec`` and nothing else: what a scheduler reads of a trial (its
    id and config), for replaying :class:`ResumableASHA` without Tune (``benchmarks/replay.py``)."""
    return Trial("replay", config={"trial": spec}, trial_id=str(spec.number), stub=True)


def _progresses(study: SweepStudy, storage: str) -> dict[int, TrialProgress]:
    """How far each trial that trained got, from its checkpoint records."""
    found = RecordStore.progress_of(storage, [t.number for t in study.trials()
                                              if t.state.name in ("COMPLETE", "PRUNED", "RUNNING")])
    return {number: progress for number, progress in found.items() if progress is not None}


def _spent(spec: SweepSpec, progresses: dict[int, TrialProgress]) -> Spend:
    """What the trials spent in every session so far."""
    return Spend(spec.share[1], sum(ledger.resource_seconds(spec.share[1], p) for p in progresses.values()),
                 sum(len(p.history) for p in progresses.values()))


def budget_spent(spec: SweepSpec, study: SweepStudy, storage: str) -> bool:
    """Whether the sweep's budget cannot pay a new trial's first epoch: a resume would start none."""
    budget = spec.budget
    return budget is not None and _spent(spec, _progresses(study, storage)).cannot_start(budget.hours,
                                                                                       budget.unit) is not None


def _epochs(trial: Trial) -> int:
    return int((trial.last_result or {}).get(M.EPOCH, 0))


def last_error(trial: Trial) -> str:
    """The last line of the trial's latest error ("NonFiniteLossError: ..."), read from the
    trial's local error file: Tune writes it before calling back, whereas the copy in the
    storage path may not be synced yet."""
    path = trial.error_file
    text = Path(path).read_text(errors="replace") if path and Path(path).exists() else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "the trial failed (Tune recorded no error text)"


def run_session(
    spec: SweepSpec, study: SweepStudy, tracker: Tracker, writer: Writer, *, storage: str, cache_dir: str,
    published: dict[Any, str], session: int, epochs: int, verbose: bool = False, notifier: Notifier | None = None,
) -> None:
    """One Tuner run over the trials the study still has to run. Progress shows a line per
    trial result; ``verbose`` brings back Ray Tune's own status tables."""
    progresses = _progresses(study, storage)
    spend = _spent(spec, progresses)
    retention = Retention(study, storage, spec.checkpoints.keep_best, progresses)
    retention.settle()
    stop_now = StopNow(study)
    searcher = StudySearcher(spec, study, storage, spend, stop_now, retention, notifier)
    objective = spec.objectives[0]
    scheduler = None
    continuing = study.continuing()
    if continuing:  # trials `seqae sweep extend` reopened train on past max_t, to limits of their own
        epochs = max(epochs, *continuing.values())
        if spec.scheduler.type != "none":
            say(f"seqae: trials {list(continuing)} train on to their new epoch limit; {spec.scheduler.label} stops "
                  "no trial this session")
    elif spec.scheduler.type != "none":
        rungs: dict[str, Any] = {"time_attr": M.EPOCH, "max_t": epochs, "grace_period": spec.scheduler.grace_period,
                                 "reduction_factor": spec.scheduler.reduction_factor,
                                 "brackets": spec.scheduler.brackets(epochs)}
        kind = ParetoASHA if spec.multi_objective else ResumableASHA
        scheduler = kind({n: p.history for n, p in progresses.items()}, spec.objectives, **rungs)
        for number in study.numbers(ledger.Outcome.RUNNING.optuna_state):
            if scheduler.stops(number, study.trial_spec(number).start is not None):  # the rungs it passed before the driver died stop it
                say(f"seqae: trial {number}: ASHA's rungs, rebuilt from the trials' records, stop it")
                ledger.settle(study, number, ledger.Outcome.PRUNED, progresses.get(number))
                writer.submit(f"closing trial {number}", partial(tracker.trial_ended, number, ledger.Outcome.PRUNED))
    # Tune's newer console output prints a config box, a results path and a TensorBoard hint
    # whatever the verbosity; its classic reporter at verbosity 0 prints nothing.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "1" if verbose else "0")
    best = study.best()
    progress = Progress(study.study.study_name, objective, study.remaining() * epochs, epochs,
                        (best[0].values[0], best[0].number) if len(best) == 1 else None)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, runtime={"storage": storage, "cache_dir": cache_dir, "published": published}),
        {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu},
    )
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            metric=objective.metric, mode=objective.mode, search_alg=searcher, scheduler=scheduler,
            num_samples=study.remaining(),
            # StudySearcher keeps to max_concurrent, which may change while the sweep runs; Tune's
            # own limit is only an upper bound, and lets that many trials wait for workers at once
            # (with none, Tune starts a custom searcher's trials one after another).
            max_concurrent_trials=max(1, study.remaining()),
            # A trial's process pays its imports (torch, Ray Tune, seqae) before its first step, most of
            # its start (measured: docs/explanation/performance.md, "The figures behind the code's
            # choices"): an ended trial's process trains the next one with the same resources.
            # Not where a node can be lost alone: Tune (2.60) counts the death of a kept process twice
            # when its node dies between two trials, and fails the next trial whatever its retries.
            reuse_actors=sum(node["Alive"] for node in ray.nodes()) == 1,
            trial_name_creator=lambda t: f"trial-{t.config['trial'].number:04d}",
            trial_dirname_creator=lambda t: f"trial-{t.config['trial'].number:04d}",
        ),
        run_config=tune.RunConfig(
            name=f"session-{session:03d}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=f"{storage.rstrip('/')}/tune",
            failure_config=tune.FailureConfig(max_failures=spec.retries),
            # the budget's stopper first: it counts every epoch's cost, also the one a stop ends on
            stop=CombinedStopper(BudgetStopper(spend, spec.budget.hours * 3600), stop_now)
            if spec.budget else stop_now,
            callbacks=[TrackingCallback(tracker, writer, study), ProgressCallback(progress, spend, stop_now),
                       *([NotifyCallback(notifier, study)] if notifier else [])],
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
