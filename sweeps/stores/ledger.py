"""A trial's outcome and what a sweep does about it: the one home of the rules in docs/explanation/resilience.md.

Three stores hold a sweep (docs/explanation/resilience.md): the Optuna study says which trials exist and how each
ended, each trial's checkpoint records say how far it got, MLflow shows it. This module decides:

- :class:`Outcome`: how a trial ended, and what Optuna and MLflow call that;
- :func:`decide`: the outcome of a trial Tune let go of, read from its checkpoint records;
- :func:`reconcile_study` and :func:`reconcile_runs`: what a new driver does before any trial starts, after a
  crash or a stop.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from optuna.trial import TrialState

from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.config import FlatValue
from seqae_core.records import RecordStore, TrialProgress
from sweeps.stores.search import SweepStudy

if TYPE_CHECKING:  # only annotations name it: reading a sweep's outcomes loads no MLflow
    from mlflow.entities import Run


class Outcome(str, enum.Enum):
    COMPLETE = "COMPLETE"  # trained to its last epoch, or stopped early by its patience or the budget
    PRUNED = "PRUNED"  # stopped by the scheduler (ASHA) before it finished
    FAIL = "FAIL"  # raised, or ended before its first epoch
    RUNNING = "RUNNING"  # interrupted with its driver, or by `seqae sweep stop --now`: the next session continues it

    @property
    def optuna_state(self) -> TrialState:
        return TrialState[self.value]

    @property
    def mlflow_status(self) -> str:
        """A pruned trial ended as a search means it to, so its run is FINISHED, as Tune's and
        Optuna's MLflow callbacks end them (the run's ``seqae.outcome`` tag tells it apart); an
        interrupted trial's run is KILLED until its trial continues, then reopened."""
        return {"COMPLETE": "FINISHED", "FAIL": "FAILED", "PRUNED": "FINISHED", "RUNNING": "KILLED"}[self.value]

    @property
    def label(self) -> str:
        """The run's ``seqae.outcome`` tag."""
        return {"COMPLETE": "complete", "FAIL": "failed", "PRUNED": "pruned", "RUNNING": "interrupted"}[self.value]


class Runs(Protocol):
    """What :func:`reconcile_runs` needs of the MLflow side (:class:`sweeps.stores.tracking.Tracker`, which
    sits above this module)."""

    def trial_runs(self) -> dict[int, Run]: ...

    def child_run(self, number: int, params: Mapping[str, FlatValue] | None = None) -> str: ...

    def open_run(
        self, number: int, params: Mapping[str, FlatValue], data: Any = None, start: str | None = None
    ) -> str: ...

    def trial_ended(self, number: int, outcome: Outcome, error: str | None = None) -> None: ...

    def retire_attempt(self, number: int, attempt: int, params: Mapping[str, FlatValue]) -> str | None: ...


def resource_seconds(share: float, progress: TrialProgress | None) -> float:
    """What a trial cost: its training wall time (every epoch it ran, over all sessions) times the
    CPUs or the GPU fraction it held (``SweepSpec.share``)."""
    return share * sum(float(h[M.EPOCH_SECONDS]) for h in (progress.history if progress else []))


def decide(
    progress: TrialProgress | None,
    error: bool,
    epochs: int | None = None,
    budget_stopped: bool = False,
    halted: bool = False,
    stopped: bool = False,
) -> Outcome:
    """How a trial ended when Tune lets go of it: an error or no epoch is a failure; records that
    say it finished (to ``epochs``, if `seqae sweep extend` raised its limit) make it complete, as
    does the budget's stop (nothing ranked it below another: the epoch it kept competes for the
    best); `seqae sweep stop --now` (``halted``) leaves it to continue; otherwise the scheduler
    stopped it, or a user did (``stopped``: `seqae sweep stop --trial`), which ends it as the
    scheduler's stop would, pruned: a person judged it behind, before its last epoch, and it stays
    off the best and the registry as ASHA's stops do (`extend --epochs` may still train it on).
    A user's stop before its first validation also prunes it: it did not fail."""
    if error or ((progress is None or not progress.history) and not stopped):
        return Outcome.FAIL
    if progress is not None and (budget_stopped or progress.done(epochs)):
        return Outcome.COMPLETE
    return Outcome.RUNNING if halted and not stopped else Outcome.PRUNED


def settle(study: SweepStudy, number: int, outcome: Outcome, progress: TrialProgress | None) -> None:
    """Record a trial's outcome in the study (a finished trial once: later calls change nothing),
    with the test metrics of the checkpoint it kept."""
    if outcome in (Outcome.COMPLETE, Outcome.PRUNED) and progress is not None:
        study.note_kept(number, progress.history)
    if outcome is Outcome.COMPLETE:
        assert progress is not None
        study.complete(number, progress.history)
    elif outcome is not Outcome.RUNNING:
        study.tell(number, outcome.optuna_state)


def reconcile_study(study: SweepStudy, storage: str, lift_drain: bool = True) -> list[str]:
    """Bring the study up to date after a driver died, before any new trial starts:

    1. RUNNING trials whose records say they finished are completed in place;
    2. other RUNNING trials stay RUNNING, to be continued from their newest valid checkpoint;
       WAITING ones (enqueued, never started) get their parameters and run now;
    3. a drain left by an earlier session (`seqae sweep stop`, a reached target) is lifted: a
       resume asks for the trials that are left (`seqae sweep extend --epochs` keeps it: it
       trains on chosen trials only); `--now` always is: it stopped that session's trials.

    Returns a note per change, for the driver to print."""
    notes = [f"trial {n}: enqueued before the driver stopped; it will run now" for n in study.start_waiting()]
    control = study.control()
    drain = control.drain
    lifted = {"drain": None} if drain and lift_drain else {}
    if control.now:
        lifted["now"] = None
    if lifted:
        study.set_control(**lifted)
    if "drain" in lifted:
        notes.append(f"the sweep had stopped starting trials ({drain}); resuming lifts that")
    asked = study.stops_asked()
    for number in study.numbers(TrialState.RUNNING):
        progress, epochs = RecordStore.of_trial(storage, number).progress(), study.epochs(number)
        if progress is not None and progress.done(epochs):
            settle(study, number, Outcome.COMPLETE, progress)
            notes.append(f"trial {number}: had finished training; recorded as complete")
        elif number in asked:  # `seqae sweep stop --trial` while no driver ran: it ends where it got to
            outcome = decide(progress, False, epochs, stopped=True)
            settle(study, number, outcome, progress)
            notes.append(f"trial {number}: stopped by {asked[number].by}; recorded as {outcome.label}")
        elif epochs is None and not study.retried_fresh(number):  # `extend` and `retry` say what they reopened
            notes.append(f"trial {number}: was interrupted; it will continue from its checkpoint")
    return notes


def reconcile_runs(study: SweepStudy, tracker: Runs) -> list[str]:
    """Bring MLflow up to the study (after :func:`reconcile_study`): runs left RUNNING are closed,
    with their trial's outcome if it ended, else as KILLED until the trial continues (then the
    same run is reopened); a run whose status is not its ended trial's is closed again, and an
    ended trial without a run gets one, filled from its records (a driver that died in an MLflow
    outage may have left either). Every step looks before it writes: a call cut short by an
    outage is done again whole. Returns a note per change."""
    notes = []
    for trial in study.trials():  # a retried trial's failed attempt keeps its own run (`seqae sweep retry`)
        if N.ATTEMPT in trial.user_attrs and (
            retired := tracker.retire_attempt(
                trial.number, int(trial.user_attrs[N.ATTEMPT]), study.trial_spec(trial.number).logged_params
            )
        ):
            notes.append(
                f"MLflow run of trial {trial.number}: attempt {trial.user_attrs[N.ATTEMPT]} in a new run; "
                f"the failed attempt's run {retired} keeps its error"
            )
    outcomes = {t.number: Outcome(t.state.name) for t in study.trials()}
    runs = tracker.trial_runs()
    for number, run in runs.items():
        if not run.data.params and number in outcomes:  # a driver was killed between creating it and logging them
            spec = study.trial_spec(number)
            tracker.child_run(number, spec.logged_params)
            notes.append(f"MLflow run of trial {number}: its parameters logged")
        status, label = run.info.status, run.data.tags.get(N.OUTCOME)
        outcome = outcomes.get(number, Outcome.FAIL)  # a run without an Optuna trial never trained
        if status == "RUNNING" or (
            outcome is not Outcome.RUNNING and (status, label) != (outcome.mlflow_status, outcome.label)
        ):
            tracker.trial_ended(number, outcome)
            notes.append(
                f"MLflow run of trial {number} closed as {outcome.mlflow_status} ({outcome.label}"
                + (", until the trial continues)" if outcome is Outcome.RUNNING else ")")
            )
    for number, outcome in outcomes.items():
        # A trial that ended while no driver could reach MLflow (a driver that died in an outage,
        # with the run's first writes still queued) has no run: open one, fill it from the records.
        if number not in runs and outcome is not Outcome.RUNNING:
            spec = study.trial_spec(number)
            tracker.open_run(number, spec.logged_params, None if spec.config is None else spec.config.data, spec.start)
            tracker.trial_ended(number, outcome)
            notes.append(
                f"MLflow run of trial {number} rebuilt from its records, as {outcome.mlflow_status} ({outcome.label})"
            )
    return notes
