"""The workspace folder: where a sweep's state, its backends' files and its checkpoints live.

    <workspace>/                        default ./seqae-runs
      mlflow.db  mlartifacts/           MLflow on SQLite with a local artifact root (local runs)
      optuna.db                         Optuna on SQLite (local runs)
      cache/                            tokenized data, shared by every trial and sweep
      sweeps/<name>/sweep.json          what the sweep is and where its runs and study live
      sweeps/<name>/submission.json     a sweep submitted to a cluster: its jobs, file and backends
      sweeps/<name>/driver.lock         held by the one driver running the sweep (.holder: who)
      sweeps/<name>/trials/<n>/         checkpoints of trial n (unless --storage puts them elsewhere)
      sweeps/<name>/tune/               Ray Tune's experiment folders, one per session

Names and paths are checked before anything is written: a sweep name is a plain file name, and
no path the service writes may leave the workspace, through ``..`` or a symbolic link.

A workspace is a folder that can move (to a bigger disk, a shared folder, off a laptop):
``sweep.json`` records the folder it was written in, and a sweep read from another folder has
every path inside the old one (its SQLite databases, its checkpoints, MLflow's artifact locations)
read inside the new one. A sweep that has run but whose stores are not where its record says is
refused, naming the path, before anything is read or created.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sqlite3
import time
import unicodedata
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from filelock import FileLock, Timeout

from seqae_core.borders import Document
from seqae_core.storage import write_atomically
from seqae_errors import ConfigError
from sweeps.spec.sweep import SweepSpec, validate

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_WORKSPACE = "seqae-runs"
SUBMISSION = "submission.json"


def check_name(name: str) -> str:
    """A sweep name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
        shown = name.encode("unicode_escape").decode() if isinstance(name, str) else repr(name)
        problems = []
        if isinstance(name, str):
            if len(name) > 64:
                problems.append(f"{len(name)} characters (at most 64)")
            if any(unicodedata.category(c) in ("Cf", "Cc") for c in name):
                problems.append("control or direction characters")
            if "/" in name or "\\" in name or ".." in name:
                problems.append("a path")
        reason = f" ({'; '.join(problems)})" if problems else ""
        raise ConfigError(
            f"sweep name {shown!r} is not allowed{reason}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def redact(uri: str) -> str:
    """``postgresql://user:secret@host/db`` -> ``postgresql://user:***@host/db``."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass
class Backends:
    """Where a sweep's tracking, study and checkpoints live."""

    mlflow_tracking_uri: str
    optuna_storage: str
    storage: str  # checkpoints and Tune state: a path, or a URI through pyarrow's filesystems

    @property
    def local(self) -> bool:
        return self.mlflow_tracking_uri.startswith("sqlite:") or self.optuna_storage.startswith("sqlite:")

    def moved(self, old: Path, new: Path) -> Backends:
        """These stores with those inside the folder ``old`` inside ``new`` instead (see :func:`moved`)."""
        return Backends(**{key: moved(value, old, new) for key, value in asdict(self).items()})


@dataclass
class SessionRecord:
    """A driver's session of a sweep, an entry of ``sweep.json``'s ``sessions``: who ran it where,
    and, once it ended, how (:attr:`outcome`), the trials by state and the outages it rode out.
    The driver fills it in as the session goes."""

    started: float
    pid: int
    user: str | None  # who drove it (sweeps.stores.ownership.actor)
    host: str
    outcome: str = "running"  # complete, stopped, interrupted, storage unreachable
    job: str | None = None  # the Ray Job it ran as (RAY_JOB_ID), None when run here
    interrupted: bool | None = None  # Ctrl-C or SIGTERM while its trials ran; None before they ran
    ended: float | None = None
    control: dict[str, Any] | None = None  # the study's control record at its end (SweepStudy.control().record())
    trials: dict[str, int] | None = None  # the study's trials by state at its end
    mlflow_outage_seconds: float | None = None
    mlflow_writes_pending: int | None = None  # the writes MLflow had not taken when it ended
    mlflow_writes_failed: int | None = None
    optuna_outage_seconds: float | None = None
    error: str | None = None  # why it ended, where its study's storage stayed away

    ALWAYS = ("started", "pid", "user", "host", "outcome", "job")  # written even when None

    def as_dict(self) -> dict[str, object]:
        """Its entry in ``sweep.json``: a field not yet filled in is left out."""
        return {k: v for k, v in asdict(self).items() if v is not None or k in self.ALWAYS}

    @classmethod
    def of_dict(cls, entry: Document) -> SessionRecord:
        """An entry of ``sweep.json``, as any version wrote it (a field it lacks is None; one this
        version does not know is left out)."""
        known = {f.name for f in fields(cls)}
        return cls(**{"user": None, **{k: v for k, v in entry.items() if k in known}})  # before owners were: no user


@dataclass
class SweepState:
    """The contents of ``sweep.json``."""

    name: str
    spec: SweepSpec  # kept as SweepSpec.to_dict, the canonical sweep
    fingerprint: str
    file: str  # the sweep file it came from
    sets: list[str]  # the --set overrides it was started with
    planned_trials: int
    backends: Backends
    study_name: str
    created: float = field(default_factory=time.time)
    extra_trials: int = 0  # added by `seqae sweep extend`
    mlflow_experiment_id: str | None = None
    mlflow_parent_run_id: str | None = None
    sessions: list[SessionRecord] = field(default_factory=list)
    forked_from: str | None = None  # the sweep whose finished trials seeded this one's study
    warm_starts: dict[str, dict[str, Any]] = field(
        default_factory=dict
    )  # warm_start resolved: {SWEEP.tN: searched values}
    code: dict[str, Any] | None = None  # the code its last session ran: {"commit": ..., "files": {path: sha256}}
    root: str | None = None  # the workspace's folder when this was written (see :meth:`Workspace.read`)
    owner: str | None = None  # the user who created it (sweeps.stores.ownership); None, before owners were: anyone's

    @property
    def total_trials(self) -> int:
        return self.planned_trials + self.extra_trials


@dataclass
class Submission:
    """The contents of ``submission.json``: a sweep submitted to a cluster from this workspace. Its
    driver keeps the sweep's own state (``sweep.json``) in the cluster's workspace; this record
    says where to find it from here, whatever the current directory and environment."""

    name: str
    address: str  # the Ray dashboard's URL
    file: str  # the sweep file, relative to working_dir
    sets: list[str]
    workspace: str  # the cluster's workspace, where its driver keeps the sweep
    working_dir: str  # the project whose tracked files are packaged as the job's working directory
    jobs: list[str] = field(default_factory=list)  # Ray Job ids, oldest first
    backends: Backends | None = None  # picked as its driver picks them
    package_files: int = 0  # the latest job's package: how many files
    package_bytes: int = 0  # ... and its size, zipped, as uploaded
    owner: str | None = None  # the user who submitted it (sweeps.stores.ownership); None, before owners were: anyone's

    @property
    def sweep_file(self) -> str:
        return str(Path(self.working_dir) / self.file)


@dataclass(frozen=True)
class Job:
    """A submitted sweep's latest Ray Job, as its cluster reports it."""

    id: str
    status: str  # Ray's JobStatus (PENDING, RUNNING, SUCCEEDED, STOPPED, FAILED), or why it is unknown
    address: str  # the cluster's dashboard, a password masked
    jobs: tuple[str, ...]  # every job of the sweep, oldest first
    dashboard: str  # the job's page on the dashboard


class Workspace:
    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        given = Path(root or os.environ.get("SEQAE_WORKSPACE", DEFAULT_WORKSPACE)).expanduser()
        if "\x00" in str(given):
            raise ConfigError("--workspace contains a NUL byte")
        self.root = given.resolve()

    # -- paths --------------------------------------------------------------------------------
    def inside(self, *parts: str) -> Path:
        """``root/parts``, refusing anything that resolves outside the workspace."""
        path = self.root.joinpath(*parts)
        real = Path(os.path.realpath(path))
        if real != self.root and self.root not in real.parents:
            raise ConfigError(f"{path} leads outside the workspace {self.root} (to {real}); refusing to write there")
        return path

    def sweep_dir(self, name: str) -> Path:
        return self.inside("sweeps", check_name(name))

    def report_dir(self, name: str) -> Path:
        return self.sweep_dir(name) / "report"

    def default_backends(self, name: str) -> Backends:
        return Backends(
            mlflow_tracking_uri=f"sqlite:///{self.inside('mlflow.db')}",
            optuna_storage=f"sqlite:///{self.inside('optuna.db')}",
            storage=str(self.sweep_dir(name)),
        )

    @property
    def artifact_root(self) -> Path:
        return self.inside("mlartifacts")

    @property
    def cache_dir(self) -> Path:
        return self.inside("cache")

    def check_paths(self, name: str) -> None:
        """Every path a sweep writes, checked before the first write: none may leave the workspace."""
        for parts in (
            ("sweeps", check_name(name)),
            ("mlflow.db",),
            ("optuna.db",),
            ("mlartifacts",),
            ("cache",),
            ("logs",),
        ):
            self.inside(*parts)

    def check_writable(self) -> None:
        """Fail early, and clearly, on a read-only or full workspace."""
        probe = self.root / f".write-probe-{os.getpid()}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(probe, "wb") as f:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise ConfigError(f"the workspace {self.root} is not writable: {exc.strerror or exc}") from None
        finally:
            with contextlib.suppress(OSError):  # on a read-only filesystem even this fails (EROFS)
                probe.unlink(missing_ok=True)

    # -- sweeps -------------------------------------------------------------------------------
    def names(self) -> list[str]:
        folder = self.root / "sweeps"
        if not folder.exists():
            return []
        return sorted(p.name for p in folder.iterdir() if (p / "sweep.json").exists() or (p / SUBMISSION).exists())

    def exists(self, name: str) -> bool:
        return (self.sweep_dir(name) / "sweep.json").exists()

    def known(self, name: str) -> None:
        """Refuse sweep ``name`` unless this workspace holds it, naming those it holds: a check that
        reads no record (:meth:`read` reads it)."""
        if not self.exists(name):
            known = ", ".join(self.names()) or "none"
            raise ConfigError(f"no sweep named {name!r} in {self.root} (sweeps there: {known})")

    def read(self, name: str) -> SweepState:
        self.known(name)
        document = json.loads((self.sweep_dir(name) / "sweep.json").read_text())
        document.pop("job", None)  # always None where older versions wrote it: a submission has its own record
        state = SweepState(
            **{
                **document,
                "spec": validate(document["spec"], document["file"]),
                "backends": Backends(**document["backends"]),
                "sessions": [SessionRecord.of_dict(s) for s in document.get("sessions", [])],
            }
        )
        written_in = Path(state.root) if state.root else _legacy_root(state)
        if written_in is not None and written_in != self.root:  # the workspace moved, or this is a copy
            state.backends = state.backends.moved(written_in, self.root)
            self._relocate_artifacts(state, written_in)
        state.root = str(self.root)
        if state.sessions:  # its driver has run, so its stores exist
            self._check_stores(state)
        return state

    def write(self, state: SweepState) -> None:
        state.root = str(self.root)
        write_json(
            self.sweep_dir(state.name) / "sweep.json",
            {**asdict(state), "spec": state.spec.to_dict(), "sessions": [s.as_dict() for s in state.sessions]},
        )

    def _local_stores(self, state: SweepState) -> list[tuple[str, Path]]:
        """The stores of ``state`` that are files or folders on this machine, with their names."""
        stores = [
            (label, Path(uri.removeprefix("sqlite:///")))
            for label, uri in (
                ("MLflow database", state.backends.mlflow_tracking_uri),
                ("Optuna database", state.backends.optuna_storage),
            )
            if uri.startswith("sqlite:///")
        ]
        storage = state.backends.storage
        return stores + ([("checkpoint storage", Path(storage))] if storage and "://" not in storage else [])

    def _check_stores(self, state: SweepState) -> None:
        """The stores the workspace holds itself exist (a store elsewhere, a server's or a folder
        of the user's, answers for itself)."""
        for label, path in self._local_stores(state):
            if path.is_relative_to(self.root) and not path.exists():
                raise ConfigError(
                    f"sweep {state.name!r}: its {label} {path} is missing (its sweep.json in "
                    f"{self.root} says it is there); move or copy the whole workspace folder, "
                    "stores included"
                )

    def _relocate_artifacts(self, state: SweepState, old: Path) -> None:
        """MLflow keeps artifact locations as absolute ``file://`` URIs in its database: in the
        workspace's own database, those inside the old folder are made to name the new one, or the
        UI, the report and `seqae encode` would read the old folder's files (or none)."""
        database = dict(self._local_stores(state)).get("MLflow database")
        if database is None or not database.exists() or not database.is_relative_to(self.root):
            return
        before, after = old.as_uri() + "/", self.root.as_uri() + "/"
        with contextlib.closing(sqlite3.connect(database, timeout=60)) as db, db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for table, column in MLFLOW_LOCATIONS:
                if table in tables:
                    db.execute(
                        f"UPDATE {table} SET {column} = ? || substr({column}, ?) "  # noqa: S608 - names are ours
                        f"WHERE substr({column}, 1, ?) = ?",
                        (after, len(before) + 1, len(before), before),
                    )

    def read_submission(self, name: str) -> Submission | None:
        """The record of a sweep submitted from this workspace, or None if it was not."""
        path = self.sweep_dir(name) / SUBMISSION
        if not path.exists():
            return None
        document = json.loads(path.read_text())
        document.pop("job", None)  # always None where older versions wrote it: a submission has its own record
        stores = document.pop("backends", None)  # a record written before its driver's stores were
        return Submission(**document, backends=Backends(**stores) if stores else None)

    def write_submission(self, record: Submission) -> None:
        write_json(self.sweep_dir(record.name) / SUBMISSION, asdict(record))


# Where MLflow's SQLite store keeps artifact locations (absolute file:// URIs for a local workspace).
MLFLOW_LOCATIONS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
    ("logged_models", "artifact_location"),
)


def moved(value: str, old: Path, new: Path) -> str:
    """``value``, a path or a ``sqlite:///`` URI, inside ``new`` instead of ``old`` when it lay
    inside ``old``; anything else (a server's URI, a path elsewhere) as it is."""
    prefix = "sqlite:///" if value.startswith("sqlite:///") else ""
    path = value.removeprefix(prefix)
    if "://" in path or not Path(path).is_relative_to(old):
        return value
    return prefix + str(new / Path(path).relative_to(old))


def _legacy_root(state: SweepState) -> Path | None:
    """The folder a ``sweep.json`` written before it recorded one was written in, where its
    checkpoints lie in the workspace's own ``sweeps/<name>``; None when they lie elsewhere."""
    storage = Path(state.backends.storage)
    if "://" in str(storage) or storage.parts[-2:] != ("sweeps", state.name):
        return None
    return storage.parent.parent


def write_json(path: Path, document: Any) -> None:
    """Atomically replace ``path`` (readers see the old file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(document, indent=1).encode())


class SweepLocked(ConfigError):
    """Another driver holds the sweep."""


class DriverLock:
    """An exclusive lock on a sweep, held by the one process that drives it: filelock's
    ``FileLock``, an ``flock`` on Unix, which the kernel drops when that process dies, however it
    dies, so a crash never leaves the sweep locked. Who holds it is written beside it, for the
    message a second driver gets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.holder = path.with_name(f"{path.name}.holder")
        self._lock = FileLock(path, timeout=0)

    def __enter__(self) -> DriverLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            holder = self.holder.read_text().strip() if self.holder.exists() else "another process"
            raise SweepLocked(
                f"sweep {self.path.parent.name!r} is already running ({holder}); "
                "only one run or resume may drive it at a time"
            ) from None
        self.holder.write_text(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


def resolve_backends(workspace: Workspace, name: str, overrides: dict[str, str | None]) -> Backends:
    """Flags, then ``SEQAE_*`` environment variables, then the workspace's embedded defaults."""
    defaults = workspace.default_backends(name)
    chosen = Backends(
        mlflow_tracking_uri=overrides.get("mlflow_tracking_uri")
        or os.environ.get("SEQAE_MLFLOW_TRACKING_URI")
        or defaults.mlflow_tracking_uri,
        optuna_storage=overrides.get("optuna_storage")
        or os.environ.get("SEQAE_OPTUNA_STORAGE")
        or defaults.optuna_storage,
        storage=overrides.get("storage") or os.environ.get("SEQAE_STORAGE") or defaults.storage,
    )
    for label, uri in (
        ("the MLflow tracking URI", chosen.mlflow_tracking_uri),
        ("the Optuna storage", chosen.optuna_storage),
        ("the storage", chosen.storage),
    ):
        if redact(uri) != uri:
            raise ConfigError(
                f"{label} {redact(uri)} carries a password; give it through the environment "
                "(PGPASSWORD or ~/.pgpass for PostgreSQL, MLFLOW_TRACKING_PASSWORD for MLflow)"
            )
    if chosen.storage != defaults.storage and "://" not in chosen.storage:
        chosen.storage = str(Path(chosen.storage).expanduser().resolve() / name)
    elif "://" in chosen.storage and chosen.storage != defaults.storage:
        chosen.storage = f"{chosen.storage.rstrip('/')}/{name}"
    return chosen


@dataclass(frozen=True)
class Listed:
    """A row of `seqae sweep list`: a sweep as its record says, no backend read."""

    name: str
    outcome: str  # its last session's; "not started", "submitted" (its state lives on the cluster), "unreadable"
    trials: int  # planned, with those extend added
    by_state: dict[str, int]  # at the end of its last session
    file: str  # the sweep file; for an unreadable sweep, why


def listing(workspace: Workspace) -> list[Listed]:
    """What `seqae sweep list` shows: a row per sweep, from its record alone (no backend is read)."""
    rows = []
    for name in workspace.names():
        if not workspace.exists(name):  # submitted; its state lives on the cluster
            rows.append(Listed(name, "submitted", 0, {}, ""))
            continue
        try:
            state = workspace.read(name)
        except ConfigError as exc:  # one sweep's missing stores do not hide the others
            rows.append(Listed(name, "unreadable", 0, {}, str(exc)))
            continue
        last = state.sessions[-1] if state.sessions else None
        rows.append(
            Listed(
                name,
                last.outcome if last else "not started",
                state.total_trials,
                (last.trials if last else None) or {},
                state.file,
            )
        )
    return rows
