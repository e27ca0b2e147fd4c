"""MLflow for a sweep: one experiment, a parent run, and one nested child run per trial.

Runs are found by tags, never kept only in memory: a child run carries ``seqae.trial`` (the
Optuna trial number), so a restarted driver reattaches the run of a continued trial instead of
opening a second one, and closes the runs a dead driver left RUNNING.

The driver calls the :class:`Tracker` through :class:`sweeps.writer.Writer`, one background
thread, so Tune's loop never waits on MLflow and SQLite only ever sees one writer; what counts
as an outage to wait out is :func:`unreachable` (never a server that refuses the credentials:
:func:`check_credentials` stops a command on that first). Every write is idempotent (metrics are
logged once per epoch), and :meth:`Tracker.sync_trial` can rebuild a child run from the trial's
checkpoint store, which holds the full metric history.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from seqae_core import metrics as M
from seqae_core.checkpoint import METRICS, MODEL, SAMPLES_JSON, SAMPLES_TXT, CheckpointStore, Progress
from seqae_core.config import from_flat, to_yaml
from seqae_errors import ConfigError
from sweeps.ledger import Outcome, resource_seconds

log = logging.getLogger(__name__)

LOGGED_METRICS = tuple(m for m in M.PER_EPOCH + M.CUDA_PER_EPOCH if m != M.EPOCH)


@dataclass
class _RunCache:
    run_id: str
    logged_steps: set[int] = field(default_factory=set)
    artifacts_epoch: int | None = None


class Tracker:
    """Synchronous MLflow operations of one sweep; :class:`sweeps.writer.Writer` runs them off the driver's loop."""

    def __init__(self, tracking_uri: str, sweep: str, storage: str, artifact_root: Path | None = None,
                 share: tuple[str, float] = ("cpu", 1.0)) -> None:
        self.uri, self.sweep, self.storage = tracking_uri, sweep, storage
        self.share = share  # what a trial holds, as its cost counts it (SweepSpec.share)
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self.artifact_root = artifact_root
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self._runs: dict[int, _RunCache] = {}

    # -- experiment and parent run ----------------------------------------------------------
    def open(self, fingerprint: str, experiment_id: str | None, parent_run_id: str | None, params: dict[str, Any]) -> None:
        """Find or create the sweep's experiment and parent run (set RUNNING)."""
        experiment = self.client.get_experiment_by_name(self.sweep)
        if experiment is not None and experiment.tags.get("seqae.fingerprint") != fingerprint:
            raise ConfigError(f"MLflow at {self.uri} already has an experiment named {self.sweep!r} that is not "
                              "this sweep's; choose another --name")
        if experiment is None:
            location = None if self.artifact_root is None else (self.artifact_root / self.sweep).as_uri()
            self.experiment_id = self.client.create_experiment(
                self.sweep, artifact_location=location, tags={"seqae.fingerprint": fingerprint, "seqae.sweep": self.sweep}
            )
        else:
            self.experiment_id = experiment.experiment_id
        if experiment_id is not None and experiment_id != self.experiment_id:
            raise ConfigError(f"the MLflow experiment of sweep {self.sweep!r} changed id ({experiment_id} -> "
                              f"{self.experiment_id}); was it deleted and recreated?")
        if parent_run_id is None:
            run = self.client.create_run(
                self.experiment_id, run_name=self.sweep,
                tags={"seqae.sweep": self.sweep, "seqae.role": "sweep"},
            )
            self.parent_run_id = run.info.run_id
            self.client.log_batch(self.parent_run_id, params=[Param(k, _text(v)) for k, v in params.items()])
        else:
            self.parent_run_id = parent_run_id
            self.client.update_run(parent_run_id, status="RUNNING")

    @property
    def _experiment(self) -> str:
        assert self.experiment_id is not None, "open() first"
        return self.experiment_id

    def finish_parent(self, status: str) -> None:
        assert self.parent_run_id is not None
        self.client.set_terminated(self.parent_run_id, status)

    # -- child runs --------------------------------------------------------------------------
    def child_run(self, number: int, params: dict[str, Any] | None = None) -> str:
        """The run of trial ``number``, created (with ``params``, every config key) if it has none yet."""
        cached = self._runs.get(number)
        if cached is not None:
            return cached.run_id
        found = self.client.search_runs(
            [self._experiment], filter_string=f"tags.`seqae.trial` = '{number}'", max_results=2
        )
        if found:
            run_id = found[0].info.run_id
            steps = {m.step for m in self.client.get_metric_history(run_id, M.VAL_TOKEN_ACCURACY)}
            art = found[0].data.tags.get("seqae.artifacts_epoch")
            self._runs[number] = _RunCache(run_id, steps, int(art) if art else None)
            return run_id
        if params is None:
            raise KeyError(f"trial {number} has no MLflow run")
        run = self.client.create_run(
            self._experiment, run_name=f"trial-{number:04d}",
            tags={"mlflow.parentRunId": self.parent_run_id, "seqae.sweep": self.sweep, "seqae.trial": str(number),
                  "optuna.trial_number": str(number)},
        )
        self.client.log_batch(run.info.run_id, params=[Param(k, _text(v)) for k, v in sorted(params.items())])
        self._runs[number] = _RunCache(run.info.run_id)
        return run.info.run_id

    def trial_started(self, number: int, params: dict[str, Any], tune_trial_id: str, continued: bool) -> None:
        run_id = self.child_run(number, params)
        self.client.update_run(run_id, status="RUNNING")
        tags = {"ray.tune_trial_id": tune_trial_id}
        if continued:
            tags["seqae.continued"] = "true"
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def trial_result(self, number: int, result: dict[str, Any]) -> None:
        run_id = self.child_run(number)
        cache = self._runs[number]
        epoch = int(result[M.EPOCH])
        tags = [RunTag(f"ray.{k}", str(result[k])) for k in ("node_id", "node_ip", "hostname") if k in result]
        if epoch in cache.logged_steps:
            self.client.log_batch(run_id, tags=tags)
            return
        self.client.log_batch(run_id, metrics=_metrics(result), tags=tags)
        cache.logged_steps.add(epoch)

    def trial_ended(self, number: int, outcome: Outcome, error: str | None = None) -> None:
        """Make the run whole from the checkpoint store, then set the status of ``outcome``."""
        progress = self.sync_trial(number)
        run_id = self.child_run(number)
        tags = [RunTag("optuna.state", outcome.value), RunTag("seqae.resource", self.share[0])]
        if error:
            tags.append(RunTag("seqae.error", error[-4000:]))
        cost = resource_seconds(self.share[1], progress)
        epochs = len(progress.history) if progress else 0
        self.client.log_batch(run_id, metrics=[Metric(M.RESOURCE_SECONDS, cost, int(time.time() * 1000), epochs)],
                              tags=tags)
        self.client.set_terminated(run_id, outcome.mlflow_status)

    def sync_trial(self, number: int) -> Progress | None:
        """Log the epochs and artifacts the run is missing, from the trial's checkpoint store;
        returns the store's progress."""
        run_id = self.child_run(number)
        cache = self._runs[number]
        store = CheckpointStore.of_trial(self.storage, number)
        progress = store.progress()
        missing = [h for h in (progress.history if progress else []) if int(h[M.EPOCH]) not in cache.logged_steps]
        for start in range(0, len(missing), 100):
            self.client.log_batch(run_id, metrics=[m for h in missing[start:start + 100] for m in _metrics(h)])
        cache.logged_steps.update(int(h[M.EPOCH]) for h in missing)
        if store.best_epoch() in (None, cache.artifacts_epoch):
            return progress
        best = store.latest("best")
        if best.epoch is not None and best.epoch != cache.artifacts_epoch:
            self._log_best(run_id, best.files)
            self.client.set_tag(run_id, "seqae.artifacts_epoch", str(best.epoch))
            cache.artifacts_epoch = best.epoch
        return progress

    def _log_best(self, run_id: str, files: dict[str, bytes]) -> None:
        saved = json.loads(files[METRICS])
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "checkpoint").mkdir()
            (folder / "checkpoint" / "model.pt").write_bytes(files[MODEL])
            (folder / "samples.txt").write_bytes(files[SAMPLES_TXT])
            (folder / "samples.json").write_bytes(files[SAMPLES_JSON])
            (folder / "best_metrics.json").write_text(json.dumps(saved, indent=1))
            import torch

            state = torch.load(folder / "checkpoint" / "model.pt", map_location="cpu", weights_only=True)
            (folder / "config.yaml").write_text(to_yaml(from_flat(state["config"])))
            self.client.log_artifacts(run_id, str(folder))

    def open_trial_runs(self) -> list[int]:
        """The trials whose MLflow runs are RUNNING: what a dead driver left open."""
        runs = self.client.search_runs([self._experiment], filter_string="attributes.status = 'RUNNING'",
                                       max_results=10_000)
        return [int(r.data.tags["seqae.trial"]) for r in runs if "seqae.trial" in r.data.tags]

    def note_outage(self, seconds: float) -> None:
        if self.parent_run_id:
            self.client.log_metric(self.parent_run_id, "mlflow_outage_seconds", seconds)

    def register_best(self, number: int, model_name: str) -> str | None:
        """Log the best trial's model as a text-in, text-out MLflow model (:mod:`sweeps.textmodel`)
        and register it; returns the version."""
        import mlflow
        import safetensors
        import torch
        import transformers

        from seqae_core import data as data_lib
        from sweeps import textmodel

        best = CheckpointStore.of_trial(self.storage, number).latest("best")
        if best.epoch is None:
            return None
        saved = best.state(MODEL)
        config = from_flat(saved["config"])
        mlflow.set_tracking_uri(self.uri)
        mlflow.set_registry_uri(self.uri)
        run_id = self.child_run(number)
        status = self.client.get_run(run_id).info.status
        root = Path(__file__).resolve().parents[1]
        with mlflow.start_run(run_id=run_id), tempfile.TemporaryDirectory() as tmp:
            artifacts = textmodel.write_artifacts(Path(tmp), saved, data_lib.load_tokenizer(config.data.tokenizer))
            info = mlflow.pyfunc.log_model(
                name="model", python_model=textmodel.__file__, artifacts=artifacts, registered_model_name=model_name,
                # the model's code imports these; `mlflow models serve` and load_model put them on sys.path
                code_paths=[str(root / "seqae_core"), str(root / "seqae_errors")],
                signature=textmodel.SIGNATURE,
                input_example=textmodel.INPUT_EXAMPLE,
                pip_requirements=[f"{m.__name__}=={m.__version__.split('+')[0]}"
                                  for m in (torch, transformers, safetensors, mlflow)],
            )
        self.client.set_terminated(run_id, status)
        return str(info.registered_model_version)


def _metrics(result: dict[str, Any]) -> list[Metric]:
    now = int(time.time() * 1000)
    epoch = int(result[M.EPOCH])
    return [Metric(k, float(result[k]), now, epoch) for k in LOGGED_METRICS if k in result]


def _text(value: Any) -> str:
    return "null" if value is None else str(value)


def unreachable(exc: BaseException) -> bool:
    """Whether a failed write may succeed later: the server or database is away, not a bug. A
    server that refuses the credentials is no outage: waiting would not change its answer."""
    import requests
    import sqlalchemy.exc

    return isinstance(exc, (MlflowException, OSError, requests.RequestException, sqlalchemy.exc.OperationalError)) \
        and not _refused(exc)


def _refused(exc: BaseException) -> bool:
    """The tracking server's authentication said no: 401 (no or wrong credentials) or 403."""
    return isinstance(exc, MlflowException) and exc.get_http_status_code() in (401, 403)


def check_credentials(uri: str) -> None:
    """Stop at once, naming what to set, when the tracking server at ``uri`` refuses this
    process's credentials (``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, which
    MLflow's client reads). A server that does not answer is left to the writer to wait out."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        MlflowClient(uri).search_experiments(max_results=1)
    except MlflowException as exc:
        if not _refused(exc):
            return
        user = os.environ.get("MLFLOW_TRACKING_USERNAME")
        who = f"user {user!r} (MLFLOW_TRACKING_USERNAME)" if user else "requests without credentials"
        raise ConfigError(
            f"the MLflow server at {uri} refuses {who} with {exc.get_http_status_code()}: set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to a user it accepts (for `seqae cluster up`'s "
            "server, `source` the env.sh it wrote)"
        ) from None


def load_registered(tracking_uri: str, model: str) -> tuple[str, Any]:
    """A registered model version, given as ``NAME`` (its newest version), ``NAME/VERSION`` or
    ``NAME@ALIAS``, with or without ``models:/``, loaded as a pyfunc: ``(its models:/ URI, the
    model)``. :class:`ConfigError` naming ``model`` if the registry at ``tracking_uri`` has no such
    version."""
    import mlflow

    from sweeps.workspace import redact

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    name, at, alias = model.removeprefix("models:/").partition("@")
    name, _, version = name.partition("/")
    where = f"in the model registry at {redact(tracking_uri)}"
    if not name or "'" in name or (version and not version.isdigit()) or (version and at):
        raise ConfigError(f"model {model!r}: expected NAME, NAME/VERSION or NAME@ALIAS (optionally after models:/)")
    try:
        versions = client.search_model_versions(f"name = '{name}'")
        if not versions:
            known = ", ".join(sorted(m.name for m in client.search_registered_models())) or "none"
            raise ConfigError(f"model {model!r}: no registered model named {name!r} {where} (registered: {known})")
        if at:
            version = client.get_model_version_by_alias(name, alias).version
    except MlflowException as exc:
        raise ConfigError(f"model {model!r}: {exc.message} ({where})") from None
    numbers = sorted(int(v.version) for v in versions)
    if version and int(version) not in numbers:
        raise ConfigError(f"model {model!r}: {name!r} has no version {version} {where} "
                          f"(versions: {', '.join(map(str, numbers))})")
    uri = f"models:/{name}/{version or numbers[-1]}"
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    return uri, mlflow.pyfunc.load_model(uri)
