"""One MLflow account per user of a cluster: ``seqae cluster add-user NAME``.

The cluster's admin (who holds its ``secrets/``) creates the account through MLflow's own
basic-auth API, with a generated password that is never printed. The password is kept twice, each
copy mode 600: in ``secrets/mlflow_accounts/NAME`` on the head, where the driver of a sweep NAME
submitted signs in as NAME (:func:`sweeps.stores.mlflow_access.sign_in_as_job_user`), and in
``users/NAME/``, the folder the user copies to their own machine: their ``env.sh`` (the cluster's
addresses through an SSH tunnel, their MLflow user, the files beside it by relative path), the
password, the Ray token and the studies' pgpass file. The laptop reaches three of the head's
loopback ports (:data:`TUNNELS`), each on a local port its variable names (default: the head's);
its workspace is its own, and a job it submits gets the cluster's (``SEQAE_CLUSTER_*``,
:data:`sweeps.running.submit.CLUSTER_SIDE`). MLflow gives a user MANAGE on what they create and nothing else until
someone grants it, so each user's sweeps are theirs; the admin reads all.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shlex
import urllib.error
import urllib.request
from operator import attrgetter
from pathlib import Path

from cluster import mlflow_server
from cluster.state import SECRETS, ClusterState
from seqae_errors import ConfigError

ACCOUNTS = "mlflow_accounts"  # in secrets/: a password file per user, named by the user
# the head's variable naming that folder, which sweeps.stores.mlflow_access reads (tested to agree)
ACCOUNTS_ENV = "SEQAE_MLFLOW_ACCOUNTS"
USERS = "users"  # in the cluster's folder: what each user copies
# MLflow's user names are free text; these also make a safe file name and a sweep owner's name
NAME = re.compile(r"[a-z][a-z0-9_.-]{0,62}")
# What a laptop reaches on the head, each through a tunnel whose local port the variable names:
# (the variable, the address that names it, where the cluster's state keeps its port on the head).
# The dashboard serves the Jobs API (submit, logs, cancel, resume); MLflow, `ui` and a status's
# runs; PostgreSQL, the study a status reads and stop and set write.
TUNNELS = (
    ("SEQAE_TUNNEL_DASHBOARD_PORT", "SEQAE_RAY_ADDRESS", "dashboard_port"),
    ("SEQAE_TUNNEL_MLFLOW_PORT", "SEQAE_MLFLOW_TRACKING_URI", "mlflow.port"),
    ("SEQAE_TUNNEL_POSTGRES_PORT", "SEQAE_OPTUNA_STORAGE", "postgres.port"),
)
# the head's own values a submitted job gets in place of the laptop's (sweeps.running.submit.CLUSTER_SIDE)
CLUSTER_SIDE = {
    "SEQAE_WORKSPACE": "SEQAE_CLUSTER_WORKSPACE",
    "SEQAE_MLFLOW_TRACKING_URI": "SEQAE_CLUSTER_MLFLOW_TRACKING_URI",
    "SEQAE_OPTUNA_STORAGE": "SEQAE_CLUSTER_OPTUNA_STORAGE",
    "PGPASSFILE": "SEQAE_CLUSTER_PGPASSFILE",
}


def accounts_dir(state: ClusterState) -> Path:
    return Path(state.root) / SECRETS / ACCOUNTS


def write_private(path: Path, text: str) -> Path:
    """``path`` with mode 600 from its creation (:func:`cluster.mlflow_server.write_private`), in a
    folder of mode 700 made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return mlflow_server.write_private(path, text)


def admin_account(state: ClusterState) -> None:
    """The admin's entry among the accounts, so that a sweep the admin submits signs in too."""
    password = Path(state.mlflow.password_file).read_text()
    write_private(accounts_dir(state) / mlflow_server.ADMIN, password)


def add_user(state: ClusterState, name: str, environment: dict[str, str]) -> Path:
    """Create MLflow user ``name`` on the cluster's server; returns the folder to hand to them,
    whose ``env.sh`` exports ``environment`` (the cluster's) as that user."""
    if not NAME.fullmatch(name):
        raise ConfigError(
            f"user name {name!r}: use lower-case letters, digits, '.', '_' or '-', starting with a letter"
        )
    if name == mlflow_server.ADMIN:
        raise ConfigError(f"user name {name!r} is MLflow's admin, which `seqae cluster up` made")
    token = ray_token(state)  # refused before the account is made
    password = secrets.token_urlsafe(24)
    _create(state, name, password)
    write_private(accounts_dir(state) / name, password)
    folder = user_dir(state, name)
    write_private(folder / "mlflow_password", password)
    write_private(folder / "ray_token", token)
    # any port: the tunnel's local one is the laptop's choice
    host, _port, rest = Path(state.postgres.pgpass_of("optuna")).read_text().split(":", 2)
    write_private(folder / "pgpass", f"{host}:*:{rest}")
    write_private(folder / "env.sh", _env_sh(state, environment, name))
    return folder


def ray_token(state: ClusterState) -> str:
    """The token the cluster's Ray asks for: the one ``up`` generated for the Ray it starts or,
    beside a Ray started by hand (``services``), the one that Ray keeps on this head, where Ray
    itself looks (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``)."""
    if state.ray:
        return Path(state.token_file).read_text()
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"]
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()
    if not path.is_file():
        raise ConfigError(
            f"no Ray token at {path} on this head: start Ray with token authentication first "
            "(`ray get-auth-token --generate`, then `ray start --head` with RAY_AUTH_MODE=token), "
            "then add users"
        )
    return path.read_text()


def tunnels(state: ClusterState, environment: dict[str, str]) -> list[tuple[str, str, int]]:
    """(the variable, the address it names, the head's port) for each server this cluster runs."""
    return [(variable, key, int(attrgetter(where)(state))) for variable, key, where in TUNNELS if key in environment]


def tunnel_command(state: ClusterState, environment: dict[str, str]) -> str:
    """The SSH tunnel a user opens from their machine, each local port the head's."""
    forwards = " ".join(f"-L {port}:127.0.0.1:{port}" for _, _, port in tunnels(state, environment))
    return f"ssh -N {forwards} YOU@HEAD"


def _create(state: ClusterState, name: str, password: str) -> None:
    """The account, through the basic-auth app's REST API as the admin (the body, not the URL, holds
    the password)."""
    uri = f"http://127.0.0.1:{state.mlflow.port}"
    admin = f"{mlflow_server.ADMIN}:{Path(state.mlflow.password_file).read_text().strip()}"
    request = urllib.request.Request(
        f"{uri}/api/2.0/mlflow/users/create",
        method="POST",
        data=json.dumps({"username": name, "password": password}).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(admin.encode()).decode(),
        },
    )
    try:
        urllib.request.urlopen(request, timeout=30).close()
    except urllib.error.HTTPError as exc:
        answer = exc.read().decode(errors="replace")
        if "RESOURCE_ALREADY_EXISTS" in answer or "already exists" in answer:
            raise ConfigError(f"user {name!r} already has an MLflow account on this cluster") from None
        raise ConfigError(
            f"the MLflow server at {uri} did not create user {name!r}: {exc.code} {answer[:200]}"
        ) from None
    except OSError as exc:
        raise ConfigError(f"the MLflow server at {uri} is not answering ({exc}): `seqae cluster up` first") from None


def user_dir(state: ClusterState, name: str) -> Path:
    return Path(state.root) / USERS / name


def _env_sh(state: ClusterState, environment: dict[str, str], name: str) -> str:
    """The user's exports, the files named relative to the script, wherever the folder is copied;
    the head's addresses through the tunnels on the local ports their variables name; the
    cluster's own workspace, stores and pgpass file for the jobs it submits."""
    files = {"PGPASSFILE": "pgpass"}
    cluster = {CLUSTER_SIDE[k]: environment[k] for k in CLUSTER_SIDE if k in environment}
    values = {
        k: v
        for k, v in environment.items()
        if k not in {"SEQAE_WORKSPACE", "RAY_AUTH_TOKEN_PATH", *CLUSTER_SIDE.values()}
    }
    values |= {"MLFLOW_TRACKING_USERNAME": name, **cluster}
    forwarded = {key: (variable, port) for variable, key, port in tunnels(state, environment)}
    lines = [
        f"# from your machine, first: {tunnel_command(state, environment)}\n",
        f"# (other local ports: set {', '.join(forwarded[k][0] for k in forwarded)} to them before sourcing)\n",
        'here="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"\n',
        'export RAY_AUTH_TOKEN_PATH="$here/ray_token"\n',
    ]
    for key, value in values.items():
        if key in files:
            lines.append(f'export {key}="$here/{files[key]}"\n')
        elif key in forwarded:
            variable, port = forwarded[key]
            loopback = f"127.0.0.1:{port}"
            if loopback not in value or set(value) & set('"$`\\'):
                raise ValueError(f"{key}={value!r} does not name the head's loopback port {port}")
            lines.append(f'export {key}="{value.replace(loopback, f"127.0.0.1:${{{variable}:-{port}}}")}"\n')
        else:
            lines.append(f"export {key}={shlex.quote(value)}\n")
    lines.append('export MLFLOW_TRACKING_PASSWORD="$(cat "$here/mlflow_password")"\n')
    return "".join(lines)
