"""What `seqae sweep status` shows of a sweep submitted to a cluster from this workspace whose
driver keeps its state in the cluster's workspace: :func:`sweeps.results.status.trials_view` read from the
backends the submission named, beside its Ray job's state and its MLflow runs."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from seqae_errors import ConfigError
from sweeps.results.status import SweepStatus, trials_view
from sweeps.running.submit import job_info
from sweeps.spec import sweep as spec_lib
from sweeps.stores.mlflow_access import check_credentials, find_sweep_run
from sweeps.stores.workspace import Backends, Submission


def submitted_sweep(record: Submission) -> tuple[spec_lib.SweepSpec, Backends]:
    """A submitted sweep's spec, as its file and overrides give it, and the stores its submission
    named, where its trials are read from this workspace."""
    spec = spec_lib.load(record.sweep_file, record.sets)
    if record.backends is None:  # a record from before submissions named their stores
        raise ConfigError(f"sweep {record.name!r}: its submission names no stores to read its trials from")
    return spec, record.backends


def status_of(record: Submission) -> SweepStatus:
    """The status of a sweep submitted from this workspace whose state lives in the cluster's
    (``record.workspace``): its trials, best and cost, read from the backends the submission
    named (its Optuna study, MLflow experiment and sweep run, and storage), beside its job's state."""
    spec, backends = submitted_sweep(record)
    check_credentials(backends.mlflow_tracking_uri)
    view = trials_view(spec, backends, record.name, spec.planned_trials())
    job = job_info(record)
    by_state = view.trials_by_state
    complete = not by_state.get("NOT_STARTED") and set(by_state) <= {"COMPLETE", "PRUNED", "FAIL"}
    client = MlflowClient(backends.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(record.name)
    run = find_sweep_run(client, experiment.experiment_id) if experiment else None
    return SweepStatus(
        **vars(view),
        name=record.name,
        workspace=record.workspace,
        outcome="complete" if complete and by_state else f"job {job.status}",
        mlflow_experiment_id=experiment.experiment_id if experiment else None,
        mlflow_parent_run_id=run.info.run_id if run else None,
        sessions=len(record.jobs),
        job=job,
        forked_from=None,
        owner=record.owner,
    )
