"""What ``seqae cluster up`` recorded of the cluster it started: ``cluster.json`` in its folder, which
``down``, ``status``, ``add-user``, ``gc`` and a later ``up`` (the same ports, database and storage
again) read. :class:`ClusterState` is its schema, :func:`read_state` and :func:`write_state` its one reader and
writer.

The file keeps the format earlier versions wrote (the same keys in the same order, one space of
indent), so a cluster one of them started is read, stopped and started again by this one; what they
may lack (the keys added since) has a default.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from cluster.postgres import Postgres
from seqae_errors import ConfigError

STATE = "cluster.json"
SECRETS = "secrets"  # in the cluster's folder, mode 700
MLFLOW_PASSWORD = "mlflow_password"  # in secrets/: the MLflow admin's
RAY_TOKEN = "ray_token"  # in secrets/: the token of the Ray `seqae cluster up` starts


@dataclass(frozen=True)
class MlflowService:
    port: int
    password_file: str  # the admin's password


@dataclass(kw_only=True)
class ClusterState:
    """The cluster's settings, addresses and processes. ``up`` fills in the processes as it starts
    them (``pids``, ``ray_sessions``) and saves it after each, so that ``down`` finds whatever
    started; ``down`` empties them."""

    root: str  # the folder it was started from
    token_file: str  # the Ray token of the Ray it starts
    workers: int
    cpus_per_worker: int
    head_cpus: int
    gpus_per_worker: int | None = None  # None: those Ray detects (and a state written before GPUs were an option)
    pass_env: list[str] = field(default_factory=list)  # `up --pass-env`'s names (a state written before it: none)
    gcs_port: int
    dashboard_port: int
    node_ports: int  # the first of the block of ports its nodes share (cluster.local.NODE_PORTS each)
    mlflow: MlflowService
    postgres: Postgres
    storage: str  # a folder or an s3:// URI
    workspace: str
    pids: dict[str, int] = field(default_factory=dict)  # {"mlflow": the MLflow server's process group}
    ray: bool  # False: `seqae cluster services`, beside a Ray started otherwise
    ray_temp_dir: str  # Ray's temporary folder, which names every process of this cluster's Ray
    ray_sessions: list[int] = field(default_factory=list)  # the sessions of its `ray start` commands
    started: float | None = None  # when `up` finished (None while it runs)


_SCHEMA = TypeAdapter(ClusterState)


def read_state(root: Path) -> ClusterState | None:
    """The state of the cluster started from ``root``; None where none was."""
    path = root / STATE
    if not path.exists():
        return None
    document = json.loads(path.read_text())
    if isinstance(document.get("mlflow"), dict):
        # Versions before MLflow's authentication, and an `up` cut short before the server started,
        # named no password file: `up` names this one.
        document["mlflow"].setdefault("password_file", str(root / SECRETS / MLFLOW_PASSWORD))
    try:
        return _SCHEMA.validate_python(document)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise ConfigError(f"{path} is not a cluster's state: {where}: {error['msg']}") from None


def write_state(root: Path, state: ClusterState) -> None:
    """Write ``state`` into ``root`` whole or not at all: a reader never sees half of it."""
    tmp = root / f".{STATE}.tmp"
    tmp.write_text(json.dumps(asdict(state), indent=1))
    os.replace(tmp, root / STATE)
