"""What `seqae sweep status` shows: trials by state, the best, the cost against the budget, and
where the runs and the study live, read from the Optuna study and the trials' records alone: no MLflow,
Ray or PyTorch is loaded, so that it answers in about a second. (A sweep submitted to a cluster adds
its job: :mod:`sweeps.submitted`; `seqae sweep list` reads the sweeps' records alone:
:func:`sweeps.workspace.listing`.)"""

from __future__ import annotations

from typing import Any

from seqae_core import names as N
from seqae_core.records import RecordStore
from sweeps import spec as spec_lib
from sweeps.ledger import resource_seconds
from sweeps.search import SweepStudy, read_only
from sweeps.workspace import Backends, Workspace, redact


def status(workspace: Workspace, name: str) -> dict[str, Any]:
    """Trials by state, the best so far, and where the runs and the study live."""
    state = workspace.read(name)
    spec = spec_lib.parse(state.spec, state.file)
    backends = Backends(**state.backends)
    last = state.sessions[-1] if state.sessions else {}
    return {
        "name": name,
        "workspace": str(workspace.root),
        "outcome": last.get("outcome", "not started"),
        **trials_view(spec, backends, state.study_name, state.total_trials),
        "mlflow_experiment_id": state.mlflow_experiment_id,
        "mlflow_parent_run_id": state.mlflow_parent_run_id,
        "sessions": len(state.sessions),
        "job": state.job,
        "forked_from": state.forked_from,
    }


def trials_view(spec: spec_lib.SweepSpec, backends: Backends, study_name: str, total: int) -> dict[str, Any]:
    """What a sweep's Optuna study and trial stores say: trials by state, the best, the control
    record, the cost; and where the runs and the study live."""
    study = read_only(spec, backends.optuna_storage, study_name)
    by_state = study.counts()
    created = sum(by_state.values())
    if created < total:
        by_state["NOT_STARTED"] = total - created
    metrics = [o.metric for o in spec.objectives]
    best = [
        {"trial": t.number, "values": dict(zip(metrics, t.values)), "params": t.params,
         "test": t.user_attrs.get(N.TEST),  # the kept checkpoint's, on pages nothing selected on; None without a test split
         "seeds": t.user_attrs.get(N.SEEDS),  # with train.repeats > 1: each seed's value and the standard error
         "start": t.user_attrs.get(N.START)}
        for t in study.best()
    ]
    return {
        "profile": spec.profile,
        "description": spec.description,
        "trials_total": total,
        "trials_by_state": by_state,
        "best": best[0] if len(best) == 1 else best or None,
        "objectives": [f"{o.metric} ({o.mode})" for o in spec.objectives],
        "mlflow_tracking_uri": redact(backends.mlflow_tracking_uri),
        "optuna_storage": redact(backends.optuna_storage),
        "optuna_study_name": study_name,
        "storage": backends.storage,
        "control": study.control(),
        "cost": cost(spec, backends.storage, study),
        "seeded_trials": len(study.forked()),
        "sampler": spec.sampler.model_dump(exclude_none=True),
        "proposed_by": study.proposals(),  # how many trials each proposer proposed: "start", "random start-up", "tpe", ...
        "starts": {t.user_attrs[N.START]: {"trial": t.number, "state": t.state.name,
                                           "values": dict(zip(metrics, t.values or [])),
                                           "test": t.user_attrs.get(N.TEST), "seeds": t.user_attrs.get(N.SEEDS)}
                   for t in study.trials() if N.START in t.user_attrs},
        "notes": spec.notes(),
    }


def cost(spec: spec_lib.SweepSpec, storage: str, study: SweepStudy) -> dict[str, Any]:
    """Resource-hours spent per trial and in all, against the budget (``ledger.resource_seconds``)."""
    progress = RecordStore.progress_of(storage, [t.number for t in study.trials()])
    per_trial = {number: resource_seconds(spec.share[1], p) for number, p in progress.items()}
    return {"unit": f"{spec.share[0]}-hours", "hours": round(sum(per_trial.values()) / 3600, 6),
            "budget": spec.budget.hours if spec.budget else None,
            "per_trial_seconds": {str(n): round(s, 2) for n, s in per_trial.items()}}
