"""What `seqae sweep status` shows: trials by state, the best, the cost against the budget, and
where the runs and the study live, read from the Optuna study and the trials' records alone: no MLflow,
Ray or PyTorch is loaded, so that it answers in about a second. (A sweep submitted to a cluster adds
its job: :mod:`sweeps.results.remote_status`; `seqae sweep list` reads the sweeps' records alone:
:func:`sweeps.stores.workspace.listing`.)"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from seqae_core import names as N
from seqae_core.records import RecordStore
from sweeps.spec import sweep as spec_lib
from sweeps.stores.ledger import resource_seconds
from sweeps.stores.search import Control, SweepStudy, read_only
from sweeps.stores.workspace import Backends, Job, Workspace, redact


@dataclass(frozen=True)
class Cost:
    """Resource-hours spent in all and per trial (``ledger.resource_seconds``), against the budget."""

    unit: str  # "cpu-hours" or "gpu-hours"
    hours: float
    budget: float | None
    per_trial_seconds: dict[str, float]  # by trial number, as text (JSON's keys)


@dataclass(frozen=True)
class BestTrial:
    trial: int
    values: dict[str, float]  # each objective's, on validation: what the search selected on
    params: dict[str, Any]  # its searched and grid keys, as Optuna holds them
    test: dict[str, float] | None  # the kept checkpoint's, on pages nothing selected on; None without a test split
    seeds: dict[str, Any] | None  # with train.repeats > 1: each seed's value and the standard error
    start: str | None  # the starting point it was, if it was one


@dataclass(frozen=True)
class StartTrial:
    """The trial a starting point of the sweep file ran as."""

    trial: int
    state: str
    values: dict[str, float]
    test: dict[str, float] | None
    seeds: dict[str, Any] | None


@dataclass(frozen=True)
class TrialsView:
    """What a sweep's Optuna study and trial stores say, and where its runs and study live."""

    profile: str | None
    description: str
    trials_total: int
    trials_by_state: dict[str, int]  # Optuna's states, and NOT_STARTED for the trials to come
    best: tuple[BestTrial, ...]  # the best trial; with several objectives the Pareto front; () before one ends
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
    starts: dict[str, StartTrial]
    notes: list[str]


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

    def as_json(self) -> dict[str, Any]:
        """What ``--json`` prints: ``best`` the one trial, the front as a list, or null before one ends."""
        document = asdict(self)
        front = document["best"]
        document["best"] = front[0] if len(front) == 1 else list(front) or None
        return document


def status(workspace: Workspace, name: str) -> SweepStatus:
    """Trials by state, the best so far, and where the runs and the study live."""
    state = workspace.read(name)
    spec = state.spec
    backends = state.backends
    last = state.sessions[-1] if state.sessions else {}
    view = trials_view(spec, backends, state.study_name, state.total_trials)
    return SweepStatus(**vars(view), name=name, workspace=str(workspace.root),
                       outcome=last.get("outcome", "not started"), mlflow_experiment_id=state.mlflow_experiment_id,
                       mlflow_parent_run_id=state.mlflow_parent_run_id, sessions=len(state.sessions), job=None,
                       forked_from=state.forked_from)


def trials_view(spec: spec_lib.SweepSpec, backends: Backends, study_name: str, total: int) -> TrialsView:
    """What a sweep's Optuna study and trial stores say: trials by state, the best, the control
    record, the cost; and where the runs and the study live."""
    study = read_only(spec, backends.optuna_storage, study_name)
    by_state = study.counts()
    created = sum(by_state.values())
    if created < total:
        by_state["NOT_STARTED"] = total - created
    metrics = [o.metric for o in spec.objectives]
    best = [BestTrial(t.number, dict(zip(metrics, t.values)), t.params, t.user_attrs.get(N.TEST),
                      t.user_attrs.get(N.SEEDS), t.user_attrs.get(N.START))
            for t in study.best()]
    return TrialsView(
        profile=spec.profile, description=spec.description, trials_total=total, trials_by_state=by_state,
        best=tuple(best), objectives=[f"{o.metric} ({o.mode})" for o in spec.objectives],
        mlflow_tracking_uri=redact(backends.mlflow_tracking_uri), optuna_storage=redact(backends.optuna_storage),
        optuna_study_name=study_name, storage=backends.storage, control=study.control(),
        cost=cost(spec, backends.storage, study), seeded_trials=len(study.forked()),
        sampler=spec.sampler.model_dump(exclude_none=True), proposed_by=study.proposals(),
        starts={t.user_attrs[N.START]: StartTrial(t.number, t.state.name, dict(zip(metrics, t.values or [])),
                                                  t.user_attrs.get(N.TEST), t.user_attrs.get(N.SEEDS))
                for t in study.trials() if N.START in t.user_attrs},
        notes=spec.notes(),
    )


def cost(spec: spec_lib.SweepSpec, storage: str, study: SweepStudy) -> Cost:
    """Resource-hours spent per trial and in all, against the budget (``ledger.resource_seconds``)."""
    progress = RecordStore.progress_of(storage, [t.number for t in study.trials()])
    per_trial = {number: resource_seconds(spec.share[1], p) for number, p in progress.items()}
    return Cost(f"{spec.share[0]}-hours", round(sum(per_trial.values()) / 3600, 6), spec.budget.hours if spec.budget else None,
                {str(n): round(s, 2) for n, s in per_trial.items()})
