"""MLflow for a sweep: one experiment, a parent run, and one nested child run per trial.

Runs are found by tags, never kept only in memory: a child run carries ``seqae.trial`` (the
Optuna trial number), so a restarted driver reattaches the run of a continued trial instead of
opening a second one, and closes the runs a dead driver left RUNNING.

The driver calls the :class:`Tracker` through :class:`sweeps.stores.writer.Writer`, one background
thread, so Tune's loop never waits on MLflow and SQLite only ever sees one writer; what counts
as an outage to wait out is :func:`sweeps.stores.mlflow_access.unreachable`. Every write is idempotent (an epoch's
metrics, and each point of its loss curve, are logged once), and :meth:`Tracker.sync_trial` can
rebuild a child run from the trial's checkpoint store, which holds the full metric history.

Each child run also records its dataset (:func:`dataset_input`) and, per epoch, the system
metrics its worker sampled (:class:`sweeps.running.system_metrics.SystemMetrics`): trials may run on
other machines, and only the driver talks to MLflow.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import safetensors
import torch
import transformers
from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import (
    MLFLOW_DATASET_CONTEXT,
    MLFLOW_EXPERIMENT_PRIMARY_METRIC_GREATER_IS_BETTER,
    MLFLOW_EXPERIMENT_PRIMARY_METRIC_NAME,
    MLFLOW_MODEL_VERSIONS,
)
from mlflow.utils.validation import MAX_ENTITIES_PER_BATCH

from seqae_core import corpus
from seqae_core import data as data_lib
from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.checkpoint import CheckpointStore, tensors
from seqae_core.config import DataConfig, Flat, FlatValue, from_flat, to_yaml
from seqae_core.epoch import EpochRecord
from seqae_core.records import METRICS, MODEL, SAMPLES_JSON, SAMPLES_TXT, TrialProgress
from seqae_errors import ConfigError
from sweeps.stores import textmodel
from sweeps.stores.ledger import Outcome, resource_seconds
from sweeps.stores.mlflow_access import find_sweep_run, fluent_uri
from sweeps.stores.mlflow_runs import all_runs

log = logging.getLogger(__name__)

# A record's result number (its epoch's by default) is its MLflow step, not a metric of its own.
LOGGED_METRICS = tuple(
    m for m in M.PER_EPOCH + M.CUDA_PER_EPOCH + M.PACK_PER_EPOCH + M.TEST_METRICS if m not in (M.EPOCH, M.VALIDATION)
)
# MLflow 3 keeps an experiment's kind in this tag, and its UI's kind selector writes this value
# for model training. (MLflow 3.17's UI opens an experiment on the page of its own workflow type
# instead, which a link picks with ?workflowType=machine_learning: dashboards.ui.runs_url.)
EXPERIMENT_KIND = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"


@dataclass
class _RunCache:
    run_id: str
    logged_steps: set[int] = field(default_factory=set)  # epochs logged whole
    logged_points: set[int] = field(default_factory=set)  # global steps of the loss curve logged
    artifacts_epoch: int | None = None


class Tracker:
    """Synchronous MLflow operations of one sweep; :class:`sweeps.stores.writer.Writer` runs them off the driver's loop."""

    def __init__(
        self,
        tracking_uri: str,
        sweep: str,
        storage: str,
        artifact_root: Path | None = None,
        share: tuple[str, float] = ("cpu", 1.0),
        entries: dict[DataConfig, Path] | None = None,
        source: dict[str, str] | None = None,
        diff: str = "",
        owner: str | None = None,
    ) -> None:
        self.uri, self.sweep, self.storage = tracking_uri, sweep, storage
        self.source, self.diff = (
            source or {},
            diff,
        )  # sweeps.running.provenance: every run's tags, the uncommitted changes
        # the user the sweep belongs to, on its experiment, runs and model (none: a sweep from before owners)
        self.owned = {N.OWNER: owner} if owner else {}
        self.share = share  # what a trial holds, as its cost counts it (SweepSpec.share)
        self.entries = entries or {}  # the prepared data, by shared settings (sweeps.running.sweep_data.prepare_data)
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self.artifact_root = artifact_root
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self._runs: dict[int, _RunCache] = {}
        self._stamps: dict[tuple[str, str, int], int] = {}

    # -- experiment and parent run ----------------------------------------------------------
    def open(
        self,
        fingerprint: str,
        experiment_id: str | None,
        parent_run_id: str | None,
        params: Mapping[str, FlatValue],
        objective: tuple[str, str] = (M.VAL_TOKEN_ACCURACY, "max"),
    ) -> None:
        """Find or create the sweep's experiment and parent run (set RUNNING). The experiment is
        marked as model training, with ``objective`` (metric, mode) as its primary metric (which
        MLflow's run charts show first); an experiment of an older seqae gains the marks it lacks."""
        experiment = self.client.get_experiment_by_name(self.sweep)
        if experiment is not None and experiment.tags.get(N.FINGERPRINT) != fingerprint:
            raise ConfigError(
                f"MLflow at {self.uri} already has an experiment named {self.sweep!r} that is not "
                "this sweep's; choose another --name"
            )
        marks = {
            EXPERIMENT_KIND: MODEL_TRAINING,
            MLFLOW_EXPERIMENT_PRIMARY_METRIC_NAME: objective[0],
            MLFLOW_EXPERIMENT_PRIMARY_METRIC_GREATER_IS_BETTER: str(objective[1] == "max"),
        }
        if experiment is None:
            location = None if self.artifact_root is None else (self.artifact_root / self.sweep).as_uri()
            self.experiment_id = self.client.create_experiment(
                self.sweep,
                artifact_location=location,
                tags={N.FINGERPRINT: fingerprint, N.SWEEP: self.sweep, **marks, **self.owned},
            )
        else:
            self.experiment_id = experiment.experiment_id
            # a mark someone changed since (in the UI, say) stays theirs
            for key, value in {**marks, **self.owned}.items():
                if key not in experiment.tags:
                    self.client.set_experiment_tag(self.experiment_id, key, value)
        if experiment_id is not None and experiment_id != self.experiment_id:
            raise ConfigError(
                f"the MLflow experiment of sweep {self.sweep!r} changed id ({experiment_id} -> "
                f"{self.experiment_id}); was it deleted and recreated?"
            )
        if parent_run_id is None:  # a driver that died before recording its run left it, maybe without params
            run = find_sweep_run(self.client, self.experiment_id) or self.client.create_run(
                self.experiment_id,
                run_name=self.sweep,
                tags={N.SWEEP: self.sweep, N.ROLE: N.ROLE_SWEEP},
            )
            self.parent_run_id = run.info.run_id
            self._complete_params(run, params)
        else:
            self.parent_run_id = parent_run_id
            self.client.update_run(parent_run_id, status="RUNNING")
        self.client.log_batch(self.parent_run_id, tags=[RunTag(k, v) for k, v in {**self.source, **self.owned}.items()])
        if self.diff:  # named by the code's digest: one file per state of the code the sweep ran
            self.client.log_text(self.parent_run_id, self.diff, f"provenance/code-{self.source['seqae.code']}.diff")

    @property
    def _experiment(self) -> str:
        assert self.experiment_id is not None, "open() first"
        return self.experiment_id

    def finish_parent(self, status: str, ended: str) -> None:
        """End the sweep's run with ``status``, saying how in its ``seqae.ended`` tag."""
        assert self.parent_run_id is not None
        self.client.set_tag(self.parent_run_id, N.ENDED, ended)
        self.client.set_terminated(self.parent_run_id, status)

    # -- child runs --------------------------------------------------------------------------
    def child_run(self, number: int, params: Mapping[str, FlatValue] | None = None) -> str:
        """The run of trial ``number``, created (with ``params``, every config key) if it has none yet."""
        cached = self._runs.get(number)
        if cached is not None:
            return cached.run_id
        found = self.client.search_runs(
            [self._experiment], filter_string=f"tags.`seqae.trial` = '{number}'", max_results=2
        )
        if found:
            run = found[0]
            steps = {m.step for m in self.client.get_metric_history(run.info.run_id, M.VAL_TOKEN_ACCURACY)}
            points = {m.step for m in self.client.get_metric_history(run.info.run_id, M.TRAIN_LOSS_STEPS)}
            art = run.data.tags.get(N.ARTIFACTS_EPOCH)
            cache = _RunCache(run.info.run_id, steps, points, int(art) if art else None)
        elif params is None:
            raise KeyError(f"trial {number} has no MLflow run")
        else:
            run = self.client.create_run(
                self._experiment,
                run_name=f"trial-{number:04d}",
                tags={
                    "mlflow.parentRunId": self.parent_run_id,
                    N.SWEEP: self.sweep,
                    N.TRIAL: str(number),
                    N.OPTUNA_TRIAL: str(number),
                },
            )
            cache = _RunCache(run.info.run_id)
        if params is not None:
            self._complete_params(run, params)
        self._runs[number] = cache
        return cache.run_id

    def _complete_params(self, run: Run, params: Mapping[str, FlatValue]) -> None:
        """Log the ``params`` that ``run`` lacks. Creating a run and logging its parameters are two
        calls: a driver killed between them, or an MLflow call that failed and is retried, leaves a
        run without parameters, which the next driver finds and must complete."""
        missing = [Param(k, _text(v)) for k, v in sorted(params.items()) if k not in run.data.params]
        if missing:
            self.client.log_batch(run.info.run_id, params=missing)

    def open_run(
        self, number: int, params: Mapping[str, FlatValue], data: DataConfig | None = None, start: str | None = None
    ) -> str:
        """Open the trial's run (RUNNING), created if it has none, with the dataset it trains on,
        ``data``: MLflow keeps a dataset once per name and digest, and its input once per run, so a
        run reattached after a restart, or continued, still has one. A starting point's run is
        tagged and named with its name."""
        run_id = self.child_run(number, params)
        self.client.update_run(run_id, status="RUNNING", name=f"trial-{number:04d}-{start}" if start else None)
        # the code this session runs, and whose sweep it is
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in {**self.source, **self.owned}.items()])
        if start:
            self.client.set_tag(run_id, N.START, start)
        if data is not None and (entry := self.entries.get(data_lib.shared_settings(data))) is not None:
            self.client.log_inputs(run_id, datasets=[dataset_input(data, entry)])
        return run_id

    def trial_started(
        self,
        number: int,
        params: Mapping[str, FlatValue],
        tune_trial_id: str,
        continued: bool,
        data: DataConfig | None = None,
        start: str | None = None,
    ) -> None:
        run_id = self.open_run(number, params, data, start)
        tags = {N.TUNE_TRIAL_ID: tune_trial_id}
        if continued:
            tags[N.CONTINUED] = "true"
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def trial_result(self, number: int, record: EpochRecord, node: Mapping[str, str], gpus: Mapping[str, str]) -> None:
        """A trial's validation ``record``, tagged with the ``node`` it trained on and the ``gpus`` Ray
        assigned it, as it saw them (:class:`sweeps.running.tune_result.TrialResult`'s)."""
        self.child_run(number)
        tags = [RunTag(f"{N.NODE}{k}", v) for k, v in node.items()]
        gpu = {"gpu": N.GPU, "gpu_ids": N.GPU_IDS, "cuda_visible_devices": N.CUDA_VISIBLE_DEVICES}
        tags += [RunTag(gpu[k], v) for k, v in gpus.items()]
        self._log_epoch(number, record.as_dict(), tags)  # MLflow's rows by metric name

    def _log_epoch(self, number: int, record: dict[str, Any], tags: list[RunTag] | None = None) -> None:
        """A validation's record (a result, or one of the checkpoint store's history), at its
        result number (the epoch's by default): its points of the loss curve, then its system
        metrics and its own, which mark it logged. Whatever is logged already is skipped, so a
        write retried after an outage logs nothing twice."""
        cache, tags = self._runs[number], tags or []
        epoch = M.result_number(record)
        if epoch in cache.logged_steps:
            if tags:
                self.client.log_batch(cache.run_id, tags=tags)
            return
        now = self._stamp(cache.run_id, M.EPOCH, epoch)
        points = [
            Metric(M.TRAIN_LOSS_STEPS, float(loss), now, int(step))
            for step, loss in record.get(M.TRAIN_LOSS_STEPS, [])
            if int(step) not in cache.logged_points
        ]
        own = _metrics(record, now) + [
            Metric(k, float(v), now, epoch) for k, v in record.items() if k.startswith(M.SYSTEM_PREFIX)
        ]
        while len(points) + len(own) + len(tags) > MAX_ENTITIES_PER_BATCH:  # a long epoch's curve first, in parts
            part, points = points[:MAX_ENTITIES_PER_BATCH], points[MAX_ENTITIES_PER_BATCH:]
            self.client.log_batch(cache.run_id, metrics=part)
            cache.logged_points.update(m.step for m in part)
        self.client.log_batch(cache.run_id, metrics=points + own, tags=tags)
        cache.logged_points.update(m.step for m in points)
        cache.logged_steps.add(epoch)

    def _stamp(self, run_id: str, series: str, step: int) -> int:
        """The timestamp of a run's ``series`` (an epoch's metrics, the cost, the best so far, an
        outage) at ``step``, taken at its first write and the same at every attempt: a batch retried
        after MLflow committed part of it (``log_batch`` writes metrics and tags in separate
        transactions) is then the same rows again, which MLflow's primary key (key, timestamp, step,
        value) keeps once. Each series keeps its own time: outage 1 is not stamped with the time of
        the first best-so-far point."""
        return self._stamps.setdefault((run_id, series, step), int(time.time() * 1000))

    def trial_ended(self, number: int, outcome: Outcome, error: str | None = None) -> None:
        """Make the run whole from the checkpoint store, then set the status of ``outcome``."""
        progress = self.sync_trial(number)
        run_id = self.child_run(number)
        tags = [RunTag(N.OUTCOME, outcome.label), RunTag(N.RESOURCE, self.share[0])]
        if error:
            tags.append(RunTag(N.ERROR, error[-4000:]))
        cost = resource_seconds(self.share[1], progress)
        epochs = len(progress.history) if progress else 0
        stamp = self._stamp(run_id, M.RESOURCE_SECONDS, epochs)
        self.client.log_batch(run_id, metrics=[Metric(M.RESOURCE_SECONDS, cost, stamp, epochs)], tags=tags)
        if outcome is Outcome.PRUNED:  # told apart at a glance in the runs list, not only by its tag
            self.client.update_run(run_id, name=f"trial-{number:04d}-pruned")
        self.client.set_terminated(run_id, outcome.mlflow_status)

    def retire_attempt(self, number: int, attempt: int, params: Mapping[str, FlatValue]) -> str | None:
        """Give attempt ``attempt`` of trial ``number`` (`seqae sweep retry`) a run of its own: the
        failed attempt's run gives its ``seqae.trial`` tag up for ``seqae.attempt_of`` and keeps its
        status, error and code tags (each attempt's commit); the two runs name each other. Returns
        the retired run's id; None where the trial's run is that attempt's already. Each step looks
        before it writes: a driver killed between two of them leaves what the next one finishes."""
        found = self.client.search_runs(
            [self._experiment], filter_string=f"tags.`seqae.trial` = '{number}'", max_results=1
        )
        if found and (found[0].data.tags.get(N.ATTEMPT, "1") == str(attempt) or found[0].info.status != "FAILED"):
            if found[0].data.tags.get(N.ATTEMPT) != str(attempt):  # created, then its driver died
                self.client.set_tag(found[0].info.run_id, N.ATTEMPT, str(attempt))
            return None
        old = (
            found[0]
            if found
            else next(
                iter(
                    self.client.search_runs(
                        [self._experiment],
                        filter_string=f"tags.`{N.ATTEMPT_OF}` = '{number}'",
                        order_by=["attributes.start_time DESC"],
                        max_results=1,
                    )
                ),
                None,
            )
        )
        if old is not None and found:
            self.client.log_batch(
                old.info.run_id,
                tags=[RunTag(N.ATTEMPT_OF, str(number)), RunTag(N.ATTEMPT, old.data.tags.get(N.ATTEMPT, "1"))],
            )
            self.client.update_run(
                old.info.run_id, name=f"trial-{number:04d}-attempt-{old.data.tags.get(N.ATTEMPT, '1')}"
            )
            self.client.delete_tag(old.info.run_id, N.TRIAL)
        self._runs.pop(number, None)
        run_id = self.child_run(number, params)
        self.client.log_batch(
            run_id,
            tags=[RunTag(N.ATTEMPT, str(attempt))]
            + ([RunTag(N.RETRY_OF_RUN, old.info.run_id)] if old is not None else []),
        )
        self.client.set_terminated(run_id, Outcome.RUNNING.mlflow_status)  # as an interrupted trial's, until it starts
        if old is not None:
            self.client.set_tag(old.info.run_id, N.RETRIED_BY, run_id)
        return old.info.run_id if old is not None else None

    def best_so_far(self, ended: int, values: dict[str, float]) -> None:
        """The sweep run's progress as MLflow charts it: the best trial's ``values`` (its objective,
        and its test score beside it) at the number of trials ``ended``, as ``best/<metric>``."""
        assert self.parent_run_id is not None
        now = self._stamp(self.parent_run_id, "best", ended)
        self.client.log_batch(
            self.parent_run_id, metrics=[Metric(f"best/{k}", v, now, ended) for k, v in values.items()]
        )

    def sync_trial(self, number: int) -> TrialProgress | None:
        """Log the epochs and artifacts the run is missing, from the trial's checkpoint store;
        returns the store's progress."""
        run_id = self.child_run(number)
        cache = self._runs[number]
        store = CheckpointStore.of_trial(self.storage, number)
        progress = store.progress()
        for record in progress.history if progress else []:
            self._log_epoch(number, record)
        if store.best_epoch() in (None, cache.artifacts_epoch):
            return progress
        best = store.latest("best", only=(SAMPLES_TXT, SAMPLES_JSON, METRICS))
        if best.epoch is not None and best.epoch != cache.artifacts_epoch:
            self._log_best(run_id, best.files, best.meta["config"])
            self.client.set_tag(run_id, N.ARTIFACTS_EPOCH, str(best.epoch))
            cache.artifacts_epoch = best.epoch
        return progress

    def _log_best(self, run_id: str, files: dict[str, bytes], config: Flat) -> None:
        """The best epoch's samples, metrics and config; its model goes to MLflow only where the
        sweep registers it (:meth:`register`), so that MLflow does not grow by a model per trial;
        ``config``: the flat config its record keeps."""
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "samples.txt").write_bytes(files[SAMPLES_TXT])
            (folder / "samples.json").write_bytes(files[SAMPLES_JSON])
            (folder / "best_metrics.json").write_text(json.dumps(json.loads(files[METRICS]), indent=1))
            (folder / "config.yaml").write_text(to_yaml(from_flat(config)))
            self.client.log_artifacts(run_id, str(folder))

    def trial_runs(self) -> dict[int, Run]:
        """Each trial's MLflow run, by trial number (a trial without a run is absent)."""
        return {int(r.data.tags[N.TRIAL]): r for r in all_runs(self.client, self._experiment) if N.TRIAL in r.data.tags}

    def note_outage(self, number: int, seconds: float) -> None:
        """Log this session's ``number``-th MLflow outage, ``seconds`` long, on the sweep's run (its
        step the outage's number, so a retried write and two outages of one length stay apart)."""
        if self.parent_run_id:
            key = "mlflow_outage_seconds"
            self.client.log_metric(
                self.parent_run_id, key, seconds, self._stamp(self.parent_run_id, key, number), number
            )

    def register(
        self,
        number: int,
        model_name: str,
        aliases: tuple[str, ...] = (N.BEST_ALIAS,),
        tags: dict[str, str] | None = None,
    ) -> tuple[str | None, bool]:
        """Log trial ``number``'s kept checkpoint as a text-in, text-out MLflow model
        (:mod:`sweeps.stores.textmodel`) and register it, unless a version of ``model_name`` already holds
        it; ``aliases`` then point at that version, which carries ``tags``. Returns the version, and
        whether it is new."""

        best = CheckpointStore.of_trial(self.storage, number).latest("best")
        if best.epoch is None:
            return None, False
        run_id = self.child_run(number)
        held = self.client.search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
        current = next((v for v in held if v.tags.get(N.MODEL_EPOCH) == str(best.epoch)), None)
        if current is not None:
            self._point(model_name, str(current.version), aliases, tags or {})
            return str(current.version), False
        saved = tensors(best.files[MODEL])
        config = from_flat(saved["config"])
        status = self.client.get_run(run_id).info.status
        root = Path(__file__).resolve().parents[2]  # the checkout, above sweeps/stores/
        with fluent_uri(self.uri):  # the registry finds a version's logged model (models:/ID) there too
            with mlflow.start_run(run_id=run_id), tempfile.TemporaryDirectory() as tmp:
                artifacts = textmodel.write_artifacts(Path(tmp), saved, corpus.load_tokenizer(config.data.tokenizer))
                info = mlflow.pyfunc.log_model(
                    name="model",
                    python_model=textmodel.__file__,
                    artifacts=artifacts,
                    # the model's code imports these; `mlflow models serve` and load_model put them on sys.path
                    code_paths=[str(root / "seqae_core"), str(root / "seqae_errors")],
                    signature=textmodel.SIGNATURE,
                    input_example=textmodel.INPUT_EXAMPLE,
                    pip_requirements=[
                        f"{m.__name__}=={m.__version__.split('+')[0]}"
                        for m in (torch, transformers, safetensors, mlflow)
                    ],
                )
            self.client.set_terminated(run_id, status)
            version = self._new_version(model_name, info.model_id, run_id)
        self.client.set_model_version_tag(model_name, version, N.MODEL_EPOCH, str(best.epoch))
        self._point(model_name, version, aliases, tags or {})
        return version, True

    def _point(self, model_name: str, version: str, aliases: tuple[str, ...], tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_model_version_tag(model_name, version, key, value)
        for alias in aliases:
            self.client.set_registered_model_alias(model_name, alias, version)

    def drop_aliases(self, model_name: str, prefix: str, keep: set[str]) -> None:
        """Remove ``model_name``'s aliases that start with ``prefix`` and are not in ``keep`` (a
        model that left the front loses its operating point's alias; its version stays)."""
        for alias in self.client.get_registered_model(model_name).aliases:
            if alias.startswith(prefix) and alias not in keep:
                self.client.delete_registered_model_alias(model_name, alias)

    def _new_version(self, model_name: str, model_id: str, run_id: str) -> str:
        """Register the logged model ``model_id`` as a new version of ``model_name`` and link the two
        as ``log_model(registered_model_name=...)`` does, through the client, which prints nothing
        to the driver's output (the fluent path prints two lines of its own)."""
        try:
            self.client.create_registered_model(model_name, tags=self.owned)
        except MlflowException as exc:
            if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
                raise
        version = self.client.create_model_version(model_name, f"models:/{model_id}", run_id, model_id=model_id)
        linked = json.loads(self.client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS, "[]"))
        self.client.set_logged_model_tags(
            model_id, {MLFLOW_MODEL_VERSIONS: json.dumps([*linked, {"name": model_name, "version": version.version}])}
        )
        return str(version.version)


def _metrics(result: dict[str, Any], now: int) -> list[Metric]:
    epoch = M.result_number(result)
    return [Metric(k, float(v), now, epoch) for k, v in result.items() if k in LOGGED_METRICS or M.is_spread(k)]


def _text(value: FlatValue) -> str:
    return "null" if value is None else str(value)


def dataset_input(data: DataConfig, entry: Path) -> DatasetInput:
    """The dataset a trial of ``data`` trains on, in MLflow's dataset API: its Hugging Face source
    (``data.path``, ``data.name``, ``data.split``), a name, the digest of the prepared entry and its
    split (:func:`seqae_core.data.describe`, which tells runs on different data apart), and as its
    profile the samples and pages of each split and the data config."""
    facts = data_lib.describe(entry, data)
    source = HuggingFaceDatasetSource(data.path, config_name=data.name, split=data.split)
    name = f"{data.path.rstrip('/').rsplit('/', 1)[-1]}:{data.samples}-{data.input_len}"
    # MLflow's typing leaves MetaDataset.profile abstract; MLflow instantiates it all the same (no ABCMeta)
    meta = MetaDataset(source, name=name, digest=facts["digest"]).to_dict()  # type: ignore[abstract]
    profile = {
        "samples": facts["samples"],
        "pages": facts["pages"],
        "entry": facts["entry"],
        "config": dataclasses.asdict(data),
    }
    return DatasetInput(
        Dataset(**meta, profile=json.dumps(profile)), tags=[InputTag(MLFLOW_DATASET_CONTEXT, "training")]
    )
