"""What `seqae sweep status` shows: trials by state, the best, the cost against the budget, and
where the runs and the study live, read from the Optuna study and the trials' records alone: no MLflow,
Ray or PyTorch is loaded, so that it answers in about a second. (A sweep submitted to a cluster adds
its job: :mod:`sweeps.results.remote_status`; `seqae sweep list` reads the sweeps' records alone:
:func:`sweeps.stores.workspace.listing`.)"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sweeps.results.trials import Trial, read_trials, unreadable
from sweeps.spec import sweep as spec_lib
from sweeps.stores import queue
from sweeps.stores.control_channel import Control
from sweeps.stores.search import read_only
from sweeps.stores.workspace import Backends, Job, Workspace, redact

# A running sweep's trials that Optuna holds RUNNING but that do not train (sweeps.stores.queue):
WAITING, PREEMPTED = "WAITING_FOR_SLOT", "PREEMPTED"


@dataclass(frozen=True)
class Cost:
    """Resource-hours spent in all and per trial (``ledger.resource_seconds``), against the budget."""

    unit: str  # "cpu-hours" or "gpu-hours"
    hours: float
    budget: float | None
    per_trial_seconds: dict[str, float]  # by trial number, as text (JSON's keys)


@dataclass(frozen=True)
class TrialsView:
    """What a sweep's Optuna study and trial stores say, and where its runs and study live."""

    profile: str | None
    description: str
    trials_total: int
    trials_by_state: dict[str, int]  # Optuna's states, NOT_STARTED for the trials to come; of a running sweep's
    # RUNNING ones, those that wait for a slot (WAITING_FOR_SLOT) or were preempted (PREEMPTED) apart
    best: tuple[Trial, ...]  # the best trial; with several objectives the Pareto front; () before one ends
    objectives: list[str]
    mlflow_tracking_uri: str  # passwords masked
    optuna_storage: str
    optuna_study_name: str
    storage: str
    control: Control  # what `seqae sweep stop|set`, a target or the budget asked of its driver
    cost: Cost
    seeded_trials: int  # a fork's trials taken from its origin
    sampler: dict[str, Any]
    proposed_by: dict[str, int]  # how many trials each proposer proposed: "start", "random start-up", "tpe", ...
    starts: dict[str, Trial]  # the trial each starting point of the sweep file ran as, by its name
    notes: list[str]
    queue: queue.Place | None  # its place in the cluster's queue (None: it never ran on this database)
    attempts: dict[str, int]  # the trials `seqae sweep retry` retried, by number (as text): the attempts each took


@dataclass(frozen=True)
class SweepStatus(TrialsView):
    """`seqae sweep status`: the trials' view, with the sweep's own record (``--json`` prints it)."""

    name: str
    workspace: str
    outcome: str  # the last session's: complete, stopped, interrupted, ...; "not started"
    mlflow_experiment_id: str | None
    mlflow_parent_run_id: str | None
    sessions: int
    job: Job | None  # a submitted sweep's
    forked_from: str | None
    owner: str | None  # the user it belongs to (sweeps.stores.ownership); None: a sweep from before owners

    def as_json(self) -> dict[str, object]:
        """What ``--json`` prints: ``best`` the one trial, the front as a list, or null before one
        ends; each best trial and starting point with the fields a reader of the sweep asks for
        (the whole record: :meth:`seqae.api.Sweep.trials`)."""
        document = asdict(self)
        front = [
            {
                "trial": t.number,
                "values": t.values,
                "params": t.params,
                "test": t.test,
                "seeds": t.seeds,
                "start": t.start or None,
            }
            for t in self.best
        ]
        document["best"] = front[0] if len(front) == 1 else front or None
        document["starts"] = {
            name: {"trial": t.number, "state": t.state, "values": t.values, "test": t.test, "seeds": t.seeds}
            for name, t in self.starts.items()
        }
        return document


def status(workspace: Workspace, name: str) -> SweepStatus:
    """Trials by state, the best so far, and where the runs and the study live."""
    state = workspace.read(name)
    spec = state.spec
    backends = state.backends
    last = state.sessions[-1] if state.sessions else None
    view = trials_view(spec, backends, state.study_name, state.total_trials)
    return SweepStatus(
        **vars(view),
        name=name,
        workspace=str(workspace.root),
        outcome=last.outcome if last else "not started",
        mlflow_experiment_id=state.mlflow_experiment_id,
        mlflow_parent_run_id=state.mlflow_parent_run_id,
        sessions=len(state.sessions),
        job=None,
        forked_from=state.forked_from,
        owner=state.owner,
    )


def trials_view(spec: spec_lib.SweepSpec, backends: Backends, study_name: str, total: int) -> TrialsView:
    """What a sweep's Optuna study and trial stores say: trials by state, the best, the control
    record, the cost; and where the runs and the study live."""
    study = read_only(spec, backends.optuna_storage, study_name)
    by_state = study.counts()
    created = sum(by_state.values())
    if created < total:
        by_state["NOT_STARTED"] = total - created
    blind = unreadable(backends.storage)
    records = {t.number: t for t in read_trials(spec, study, None if blind else backends.storage)}
    # a sweep given no slot yet has created no trial: its place says why it waits
    place = next((p for p in queue.Queue(backends.optuna_storage, create=False).view() if p.sweep == study_name), None)
    return TrialsView(
        profile=spec.profile,
        description=spec.description,
        trials_total=total,
        trials_by_state=split_running(by_state, place),
        best=tuple(records[t.number] for t in study.best()),
        objectives=[f"{o.metric} ({o.mode})" for o in spec.objectives],
        mlflow_tracking_uri=redact(backends.mlflow_tracking_uri),
        optuna_storage=redact(backends.optuna_storage),
        optuna_study_name=study_name,
        storage=backends.storage,
        control=study.control(),
        cost=cost(spec, list(records.values())),
        seeded_trials=len(study.forked()),
        sampler=spec.sampler.model_dump(exclude_none=True),
        proposed_by=study.proposals(),
        starts={t.start: t for t in records.values() if t.start},
        notes=[*spec.notes(), *study.narrowing_notes(), *([blind] if blind else [])],
        queue=place,
        attempts={str(t.number): t.attempts for t in records.values() if t.attempts > 1},
    )


def split_running(by_state: dict[str, int], place: queue.Place | None) -> dict[str, int]:
    """Optuna's RUNNING trials of a sweep whose driver runs, as its driver last saw them in Ray
    Tune: training, waiting for a slot (proposed, or resumed, and not yet placed) or preempted.
    Optuna holds a trial RUNNING from its proposal on; the driver's beat may lag a moment behind."""
    running = by_state.get("RUNNING", 0)
    if place is None or place.state in (queue.DONE, queue.STOPPED) or not running:
        return by_state
    training, paused = min(place.held, running), min(place.paused, running - min(place.held, running))
    split = {"RUNNING": training, WAITING: running - training - paused, PREEMPTED: paused}
    out: dict[str, int] = {}
    for state, count in by_state.items():
        out.update({k: v for k, v in split.items() if v} if state == "RUNNING" else {state: count})
    return out


def cost(spec: spec_lib.SweepSpec, trials: list[Trial]) -> Cost:
    """Resource-hours spent per trial and in all, against the budget (``ledger.resource_seconds``)."""
    per_trial = {t.number: t.cost_seconds for t in trials}
    return Cost(
        f"{spec.share[0]}-hours",
        round(sum(per_trial.values()) / 3600, 6),
        spec.budget.hours if spec.budget else None,
        {str(n): round(s, 2) for n, s in per_trial.items()},
    )
