"""`seqae sweep delete`: a sweep and everything it wrote, gone from every store.

What a sweep writes, and how each part goes:

- its folder in the workspace (``sweep.json``, ``submission.json``, its report, Tune's folders
  and, unless ``--storage`` put them elsewhere, its checkpoints), and a checkpoint storage
  elsewhere (a folder, or a URI through pyarrow's filesystems): removed whole;
- its Optuna study (trials, their values and attributes): ``optuna.delete_study``;
- its row in the cluster's queue (:mod:`sweeps.stores.queue`);
- its MLflow experiment, the parent run and a child run per trial, their artifacts and the
  logged models of registered versions: MLflow's own ``delete_run`` only marks a run deleted and
  leaves its artifacts (mlflow/mlflow#14988), so they are marked deleted and then purged by
  ``mlflow gc``, which deletes each one's artifacts through its artifact repository (a folder,
  S3, ...) and then its rows. A tracking server's database is out of reach from here (least
  privilege: a user holds no database credentials): there the artifacts are deleted through the
  server, the experiment is tagged :data:`~seqae_core.names.DELETED`, and the rows stay marked
  deleted until the cluster's admin runs ``seqae cluster gc`` (:func:`purge_marked`) where the
  database's credentials are;
- a registered model version of its trials is kept (and with it its logged model and the
  experiment that holds it) unless ``models``;
- its data-cache entries, those no other sweep of the workspace uses.

Deleting is refused while its driver runs (it holds the sweep's lock, or beats in the queue) and
for anyone but the sweep's owner and MLflow's admin (:mod:`sweeps.stores.ownership`).
"""

from __future__ import annotations

import contextlib
import io
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pyarrow.fs as pafs
import sqlalchemy as sa
from filelock import FileLock, Timeout
from mlflow.cli import _gc_tracking_resources
from mlflow.entities import ViewType
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.store.tracking.dbmodels.models import SqlInput, SqlInputTag
from mlflow.tracking import MlflowClient
from mlflow.utils.file_utils import local_file_uri_to_path

from seqae_core import data as data_lib
from seqae_core import names as N
from seqae_core.storage import filesystem
from seqae_errors import ConfigError
from sweeps.spec.sweep import SweepSpec, cell_configs
from sweeps.stores import ownership
from sweeps.stores.mlflow_access import fluent_uri
from sweeps.stores.mlflow_runs import all_runs
from sweeps.stores.queue import Queue
from sweeps.stores.search import storage, study_exists
from sweeps.stores.workspace import Backends, Workspace, redact

PAGE = 100  # run ids per query: a search of their registered versions, a purge of their links


@dataclass(frozen=True)
class Part:
    """One thing a deletion removes (or keeps): what it is, where, and its size."""

    what: str  # "workspace folder", "checkpoints", "Optuna study", "MLflow runs", ...
    where: str
    rows: int = 0  # database rows it stands for: trials, runs, model versions, a queue row
    files: int = 0
    bytes: int = 0
    note: str = ""


@dataclass(frozen=True)
class Deletion:
    """What ``delete`` removed (or, on a dry run, would remove), and what it kept."""

    name: str
    dry_run: bool
    removed: tuple[Part, ...]
    kept: tuple[Part, ...] = ()
    pending: str = ""  # what is left for someone else to remove (a tracking server's rows), and who does it

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.removed)

    @property
    def files(self) -> int:
        return sum(p.files for p in self.removed)


@dataclass
class _Mlflow:
    """The sweep's MLflow records, found before anything is deleted."""

    uri: str
    experiment_id: str | None = None
    experiment_location: str | None = None
    experiment_active: bool = True
    runs: list[Any] = field(default_factory=list)  # mlflow.entities.Run, the parent first
    versions: list[Any] = field(default_factory=list)  # ModelVersion of its runs
    logged_models: list[Any] = field(default_factory=list)  # LoggedModel of its experiment


def delete(workspace: Workspace, name: str, *, models: bool = False, dry_run: bool = False) -> Deletion:
    """Delete sweep ``name`` from every store (see the module's docstring), or with ``dry_run`` only
    say what that would remove. Refused while its driver runs and for anyone but its owner."""
    folder = workspace.sweep_dir(name)
    submission = workspace.read_submission(name)
    state = workspace.read(name) if workspace.exists(name) or submission is None else None
    backends: Backends | None = state.backends if state is not None else submission.backends if submission else None
    if backends is not None and not all(map(_held, (backends.optuna_storage, backends.mlflow_tracking_uri))):
        backends = None  # a sweep recorded and never run: its SQLite stores were never made (nor made now)
    own = _folder_part("workspace folder", str(folder))  # before the lock below, which may make a file
    with _unless_driven(folder, name, dry_run):
        study_owner = _study_owner(backends, name)
        record_owner = state.owner if state is not None else submission.owner if submission else None
        ownership.check(name, study_owner or record_owner, "delete")
        _refuse_if_beating(backends, name)
        spec = state.spec if state is not None else None
        mlflow = _find_mlflow(backends.mlflow_tracking_uri, name) if backends else None
        removed, kept = [own], []
        if backends and backends.storage != str(folder):
            removed.append(_folder_part("checkpoints", backends.storage))
        if backends and (trials := _study_trials(backends.optuna_storage, name)) is not None:
            removed.append(
                Part("Optuna study", redact(backends.optuna_storage), rows=trials, note=count(trials, "trial"))
            )
        if backends and _queue_row(backends.optuna_storage, name):
            removed.append(Part("queue row", redact(backends.optuna_storage), rows=1, note="its place in the queue"))
        if mlflow is not None and mlflow.experiment_id is not None:
            parts, held = _mlflow_parts(mlflow, models)
            removed += parts
            kept += held
        entries = _cache_entries(workspace, name, spec) if spec is not None else []
        removed += [_folder_part("data-cache entry", str(e), note="no other sweep uses it") for e in entries]
        pending = ""
        if mlflow is not None and mlflow.experiment_id is not None and _served(mlflow.uri):
            pending = (
                f"its MLflow rows stay marked deleted on {redact(mlflow.uri)} (its database is the server's) "
                "until the cluster's admin runs `seqae cluster gc`"
            )
        deletion = Deletion(
            name,
            dry_run,
            tuple(p for p in removed if p.files or p.rows or p.what == "workspace folder"),
            tuple(kept),
            pending,
        )
        if dry_run:
            return deletion
        if backends is not None:
            _delete_study(backends.optuna_storage, name)
            if mlflow is not None and mlflow.experiment_id is not None:
                _delete_mlflow(mlflow, models)
            if backends.storage != str(folder):
                _remove(backends.storage)
        for entry in entries:
            shutil.rmtree(entry, ignore_errors=True)
            entry.with_name(f"{entry.name}.lock").unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)  # the driver's lock last: no driver started meanwhile
    return deletion


def count(n: int, thing: str) -> str:
    """``1 trial``, ``2 trials``."""
    return f"{n:,} {thing}{'' if n == 1 else 's'}"


def _held(uri: str) -> bool:
    """Whether a store may hold something: a server's always, a SQLite file once it exists."""
    return not uri.startswith("sqlite:///") or Path(uri.removeprefix("sqlite:///")).exists()


@contextlib.contextmanager
def _unless_driven(folder: Path, name: str, looking: bool) -> Iterator[None]:
    """Hold the sweep's driver lock (:class:`~sweeps.stores.workspace.DriverLock`'s file) while
    deleting, so no driver starts meanwhile; refused while one holds it. A dry run (``looking``)
    only checks, where no driver ever made the lock."""
    lock_file = folder / "driver.lock"
    if not folder.exists() or (looking and not lock_file.exists()):  # a dry run writes nothing, not even the lock
        yield
        return
    lock = FileLock(lock_file, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = lock_file.with_name("driver.lock.holder")
        who = holder.read_text().strip() if holder.exists() else "another process"
        raise ConfigError(
            f"sweep {name!r} is running ({who}); stop it (`seqae sweep stop {name} --now`) and "
            "delete it once its driver has ended"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _study_owner(backends: Backends | None, name: str) -> str | None:
    if backends is None or not study_exists(backends.optuna_storage, name):
        return None

    store = storage(backends.optuna_storage)
    return store.get_study_user_attrs(store.get_study_id_from_name(name)).get(N.OWNER)


def _refuse_if_beating(backends: Backends | None, name: str) -> None:
    """A driver elsewhere (a submitted sweep's, on a cluster's head) beats in the queue."""
    entry = _queue_row(backends.optuna_storage, name) if backends else None
    if entry is not None and entry.ended is None and entry.live(time.time()):
        raise ConfigError(
            f"sweep {name!r} is running (its driver on {entry.host}, pid {entry.pid}, beats in the "
            f"queue); stop it (`seqae sweep stop {name} --now`) and delete it once it has ended"
        )


def _queue_row(url: str, name: str) -> Any:
    return Queue(url, create=False).entry(name)


def _study_trials(url: str, name: str) -> int | None:
    if not study_exists(url, name):
        return None
    store = storage(url)
    return len(store.get_all_trials(store.get_study_id_from_name(name), deepcopy=False))


def _delete_study(url: str, name: str) -> None:

    if study_exists(url, name):
        optuna.delete_study(study_name=name, storage=storage(url))
    queue = Queue(url, create=False)
    if queue.kept:
        queue.forget(name)


# -- files and folders ----------------------------------------------------------------------
def _folder_part(what: str, where: str, note: str = "") -> Part:
    files, size = _size(where)
    return Part(what, where, files=files, bytes=size, note=note)


def _size(where: str) -> tuple[int, int]:
    """How many files a folder (a path or a URI) holds, and their bytes; none if it is absent."""

    fs, path = filesystem(where)
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return 0, 0
    infos = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if i.type == pafs.FileType.File]
    return len(infos), sum(i.size or 0 for i in infos)


def _remove(where: str) -> None:
    fs, path = filesystem(where)
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        fs.delete_dir(path)


def _cache_entries(workspace: Workspace, name: str, spec: SweepSpec) -> list[Path]:
    """The sweep's data-cache entries in the workspace's cache that no other sweep there uses."""
    mine = _entry_names(spec)
    for other in workspace.names():
        if other != name and workspace.exists(other):
            with contextlib.suppress(ConfigError):  # an unreadable sweep's entries are its own business
                mine -= _entry_names(workspace.read(other).spec)
    return [workspace.cache_dir / e for e in sorted(mine) if (workspace.cache_dir / e).is_dir()]


def _entry_names(spec: SweepSpec) -> set[str]:
    return {data_lib.entry_name(data_lib.cache_key(data_lib.shared_settings(c.data))) for c in cell_configs(spec)}


# -- MLflow ---------------------------------------------------------------------------------
def _client(uri: str) -> Any:
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _find_mlflow(uri: str, name: str) -> _Mlflow:

    client, found = _client(uri), _Mlflow(uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return found
    found.experiment_id, found.experiment_location = experiment.experiment_id, experiment.artifact_location
    found.experiment_active = experiment.lifecycle_stage == "active"
    found.runs = list(all_runs(client, experiment.experiment_id, view=ViewType.ALL))
    ids = sorted(r.info.run_id for r in found.runs)
    for start in range(0, len(ids), PAGE):  # a filter of a page of ids at a time: a long sweep has many runs
        listed = ", ".join(f"'{i}'" for i in ids[start : start + PAGE])
        found.versions += client.search_model_versions(f"run_id IN ({listed})")
    found.logged_models = list(client.search_logged_models(experiment_ids=[experiment.experiment_id]))
    return found


def _artifacts(uri: str | None, tracking_uri: str) -> tuple[int, int]:
    """Files and bytes under an artifact URI, listed through its artifact repository (a server's
    ``mlflow-artifacts:/`` URI resolves against ``tracking_uri``)."""
    if not uri:
        return 0, 0

    with fluent_uri(tracking_uri):
        repo = get_artifact_repository(uri)
    files = size = 0
    pending: list[str | None] = [None]
    while pending:
        try:
            listed = repo.list_artifacts(pending.pop())
        except (OSError, ValueError):  # a location that was never written
            continue
        for info in listed:
            if info.is_dir:
                pending.append(info.path)
            else:
                files, size = files + 1, size + (info.file_size or 0)
    return files, size


def _kept_models(found: _Mlflow, models: bool) -> set[str]:
    """The logged models that registered versions (kept unless ``models``) stand on: a version's
    ``source`` is ``models:/<id>`` (its ``model_id``, which a search of versions leaves unset)."""
    if models:
        return set()
    return {
        v.model_id or v.source.removeprefix("models:/")
        for v in found.versions
        if v.model_id or v.source.startswith("models:/")
    }


def _mlflow_parts(found: _Mlflow, models: bool) -> tuple[list[Part], list[Part]]:
    where = redact(found.uri)
    run_files = [_artifacts(r.info.artifact_uri, found.uri) for r in found.runs]
    kept_models = _kept_models(found, models)
    gone_models = [m for m in found.logged_models if m.model_id not in kept_models]
    model_files = [_artifacts(m.artifact_location, found.uri) for m in gone_models]
    removed = [
        Part(
            "MLflow runs",
            where,
            rows=len(found.runs),
            files=sum(f for f, _ in run_files),
            bytes=sum(b for _, b in run_files),
            note=f"{count(len(found.runs), 'run')}, the parent too, with their artifacts",
        )
    ]
    if gone_models:
        removed.append(
            Part(
                "MLflow logged models",
                where,
                rows=len(gone_models),
                files=sum(f for f, _ in model_files),
                bytes=sum(b for _, b in model_files),
                note=count(len(gone_models), "model"),
            )
        )
    if models and found.versions:
        removed.append(
            Part(
                "registered model versions",
                where,
                rows=len(found.versions),
                note=", ".join(f"{v.name} version {v.version}" for v in found.versions),
            )
        )
    if not kept_models:
        removed.append(Part("MLflow experiment", where, rows=1, note=f"experiment {found.experiment_id}"))
        return removed, []
    held = [m for m in found.logged_models if m.model_id in kept_models]
    held_files = [_artifacts(m.artifact_location, found.uri) for m in held]
    return removed, [
        Part(
            "registered model versions",
            where,
            rows=len(found.versions),
            files=sum(f for f, _ in held_files),
            bytes=sum(b for _, b in held_files),
            note=", ".join(f"{v.name} version {v.version}" for v in found.versions)
            + f", with the logged models they stand on, in experiment {found.experiment_id} "
            "(--models deletes them too)",
        )
    ]


def _served(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def _delete_mlflow(found: _Mlflow, models: bool) -> None:
    client = _client(found.uri)
    kept_models = _kept_models(found, models)
    assert found.experiment_id is not None  # a sweep without an experiment has nothing here to delete
    if _served(found.uri) and found.experiment_active:
        # what `seqae cluster gc` purges: this experiment's deleted runs, models and itself; not what a
        # user deleted in MLflow's UI, which stays restorable there (a deleted experiment takes no tag)
        client.set_experiment_tag(found.experiment_id, N.DELETED, "true")
    if models:
        for version in found.versions:
            client.delete_model_version(version.name, version.version)
        for model_name in {v.name for v in found.versions}:
            if not client.search_model_versions(f"name = '{model_name}'"):
                client.delete_registered_model(model_name)
    for run in found.runs:
        if run.info.lifecycle_stage != "deleted":
            client.delete_run(run.info.run_id)
    gone_models = [m.model_id for m in found.logged_models if m.model_id not in kept_models]
    for model_id in gone_models:
        client.delete_logged_model(model_id)
    whole = not kept_models
    if whole:
        client.delete_experiment(found.experiment_id)
    if _served(found.uri):
        # the server's database is its own: delete the artifacts through it (``mlflow-artifacts:/``
        # URIs resolve against the tracking URI), the rows stay marked deleted for `seqae cluster gc`

        with fluent_uri(found.uri):
            for uri in [r.info.artifact_uri for r in found.runs] + [
                m.artifact_location for m in found.logged_models if m.model_id in gone_models
            ]:
                get_artifact_repository(uri).delete_artifacts()
        return
    _gc(found.uri, [r.info.run_id for r in found.runs], gone_models, [found.experiment_id] if whole else [])
    _purge_links(found.uri, [r.info.run_id for r in found.runs])
    if whole and found.experiment_location:  # the experiment's own folder, emptied by the above
        _remove_empty(found.experiment_location)


def _gc(
    uri: str, runs: list[str], logged_models: list[str], experiments: list[str], tracking: str | None = None
) -> None:
    """``mlflow gc`` on the store at ``uri`` for exactly these runs, logged models and experiments
    (each already marked deleted): their artifacts, resolved against ``tracking`` (default: ``uri``;
    a server's ``mlflow-artifacts:/`` URIs need the server's), then their rows. Through the body of
    MLflow's command, which takes the lists as they are: the command reads a kind left out as
    every one marked deleted in the store, not none (and it extends the list of runs it is given
    with the experiments' runs: it gets a copy). Its lines (one per thing) are not the
    user's: the caller says what went."""

    with fluent_uri(tracking or uri), contextlib.redirect_stdout(io.StringIO()):
        _gc_tracking_resources(
            _client(uri)._tracking_client.store,
            run_ids=list(runs),
            experiment_ids=experiments,
            logged_model_ids=logged_models,
            older_than=None,
            time_delta=0,
            skip_experiments=not experiments,
            skip_logged_models=False,
        )


def _purge_links(uri: str, run_ids: list[str]) -> None:
    """The rows that link the purged runs to their datasets and logged models (MLflow's ``inputs``
    and ``input_tags``), which ``mlflow gc`` leaves behind: it deletes a run's own rows, not the
    links that name it. Through MLflow's own table models, the one place seqae reaches into its
    schema (tests/test_delete.py finds any row left that names the sweep)."""

    inputs, tags = SqlInput.__table__, SqlInputTag.__table__
    engine = sa.create_engine(uri)
    try:
        with engine.begin() as db:
            for start in range(0, len(run_ids), PAGE):
                ids = run_ids[start : start + PAGE]
                linked = sa.select(inputs.c.input_uuid).where(
                    sa.or_(inputs.c.destination_id.in_(ids), inputs.c.source_id.in_(ids))
                )
                db.execute(sa.delete(tags).where(tags.c.input_uuid.in_(linked)))
                db.execute(sa.delete(inputs).where(inputs.c.input_uuid.in_(linked)))
    finally:
        engine.dispose()


def _remove_empty(location: str) -> None:
    """An artifact folder left with only empty folders in it (a local one; an object store has none)."""
    if not location.startswith("file://") and "://" in location:
        return

    path = Path(local_file_uri_to_path(location))
    if path.is_dir() and not any(p.is_file() for p in path.rglob("*")):
        shutil.rmtree(path)


@dataclass(frozen=True)
class Purged:
    """What ``seqae cluster gc`` removed: rows (and any artifact left) of sweeps deleted through the server."""

    runs: int
    logged_models: int
    experiments: int


def purge_marked(backend_uri: str, tracking_uri: str) -> Purged:
    """Purge, in the tracking server's own store at ``backend_uri`` (whose credentials the caller
    holds), what ``delete`` marked deleted through the server at ``tracking_uri``: the deleted runs
    and logged models of the experiments it tagged :data:`~seqae_core.names.DELETED`, those
    experiments once deleted, and the rows that link the runs to their datasets, as ``delete``
    does at once in a workspace's own store. Nothing else: a run or experiment a user deleted in
    MLflow's UI stays restorable there."""
    client = _client(backend_uri)
    marked: dict[str, Any] = {}  # by id: a page of MLflow's search may repeat an experiment
    token = None
    while True:
        page = client.search_experiments(
            view_type=ViewType.ALL, filter_string=f"tags.`{N.DELETED}` = 'true'", page_token=token
        )
        marked |= {e.experiment_id: e for e in page}
        if not (token := page.token):
            break
    runs = sorted({r.info.run_id for e in marked for r in all_runs(client, e, view=ViewType.DELETED_ONLY)})
    store = client._tracking_client.store
    models = sorted(
        m
        for m in store._get_deleted_logged_models()
        if store.get_logged_model(m, allow_deleted=True).experiment_id in marked
    )
    experiments = sorted(e for e, experiment in marked.items() if experiment.lifecycle_stage == "deleted")
    if runs or models or experiments:
        _gc(backend_uri, runs, models, experiments, tracking=tracking_uri)
        _purge_links(backend_uri, runs)
    return Purged(len(runs), len(models), len(experiments))
