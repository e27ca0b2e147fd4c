"""What `seqae sweep status` shows: trials by state, the best, the cost against the budget, and
where the runs and the study live; for local sweeps and for sweeps submitted to a cluster alike.
(`seqae sweep list` reads the sweeps' records alone: :func:`sweeps.workspace.listing`.)"""

from __future__ import annotations

from typing import Any

from mlflow.tracking import MlflowClient

from seqae_core import names as N
from seqae_core.checkpoint import CheckpointStore
from sweeps import spec as spec_lib
from sweeps.ledger import resource_seconds
from sweeps.mlflow_access import check_credentials
from sweeps.search import SweepStudy, read_only
from sweeps.submit import job_info
from sweeps.tracking import find_sweep_run
from sweeps.workspace import Backends, Submission, Workspace, redact


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


def submitted_status(record: Submission) -> dict[str, Any]:
    """The status of a sweep submitted from this workspace whose state lives in the cluster's
    (``record.workspace``): its trials, best and cost, read from the backends the submission
    named (its Optuna study, MLflow experiment and sweep run, and storage), beside its job's state."""
    spec = spec_lib.load(record.sweep_file, record.sets)
    backends = Backends(**record.backends)
    check_credentials(backends.mlflow_tracking_uri)
    view = trials_view(spec, backends, record.name, spec.planned_trials())
    job = job_info(record)
    by_state = view["trials_by_state"]
    complete = not by_state.get("NOT_STARTED") and set(by_state) <= {"COMPLETE", "PRUNED", "FAIL"}
    client = MlflowClient(backends.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(record.name)
    run = find_sweep_run(client, experiment.experiment_id) if experiment else None
    return {
        "name": record.name,
        "workspace": record.workspace,
        "outcome": "complete" if complete and by_state else f"job {job['status']}",
        **view,
        "mlflow_experiment_id": experiment.experiment_id if experiment else None,
        "mlflow_parent_run_id": run.info.run_id if run else None,
        "sessions": len(record.jobs),
        "job": job,
        "forked_from": None,
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
    per_trial = {t.number: resource_seconds(spec.share[1], CheckpointStore.of_trial(storage, t.number).progress())
                 for t in study.trials()}
    return {"unit": f"{spec.share[0]}-hours", "hours": round(sum(per_trial.values()) / 3600, 6),
            "budget": spec.budget.hours if spec.budget else None,
            "per_trial_seconds": {str(n): round(s, 2) for n, s in per_trial.items()}}
