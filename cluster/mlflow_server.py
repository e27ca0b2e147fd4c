"""An MLflow tracking server bound to loopback, with the security defaults seqae keeps: only
loopback Host headers are accepted, on any port, so that a browser or client behind an SSH tunnel
or `kubectl port-forward` on another local port is served, while a foreign Host gets 403 (against
DNS rebinding); and only loopback origins may write across origins (other cross-origin writes get
403).

With an ``auth`` config (what :func:`write_auth_config` writes), the server runs MLflow's own
authentication, the ``basic-auth`` app: every request needs a user's name and password (401
without them), the admin user is created on the first start, and users and their permissions
live in the config's database."""

from __future__ import annotations

import configparser
import os
import secrets
import sys
from pathlib import Path

from cluster.procs import http_ok, spawn, wait_until

ADMIN = "admin"  # MLflow's own name for the user its basic-auth app creates first
# MLflow matches these with fnmatch; a browser leaves the port out only for port 80. Cross-origin
# writes need no flag: MLflow itself allows loopback origins on any port and refuses the others
# (a wildcard origin given here would be read as a regular expression by flask-cors, which matches
# a prefix: http://127.0.0.1.evil.example too).
LOOPBACK_HOSTS = "127.0.0.1,localhost,127.0.0.1:*,localhost:*"


def argv(backend_uri: str, artifacts: str, port: int, host: str = "127.0.0.1", auth: bool = False) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        backend_uri,
        "--artifacts-destination",
        artifacts,
        "--serve-artifacts",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        "--allowed-hosts",
        LOOPBACK_HOSTS,
        *(["--app-name", "basic-auth"] if auth else []),
    ]


def write_auth_config(path: Path, password_file: Path, database_uri: str) -> None:
    """The basic-auth app's config (mode 600): the admin user, with the password kept in
    ``password_file`` (generated there on the first call, mode 600); users in ``database_uri``;
    new users get no permission until an admin grants one. MLflow reads the admin's password only
    to create the admin on a fresh user database, so a restart keeps the users and passwords."""
    if not password_file.exists():
        write_private(password_file, secrets.token_urlsafe(24))
    config = configparser.ConfigParser()
    config["mlflow"] = {
        "default_permission": "NO_PERMISSIONS",
        "database_uri": database_uri,
        "admin_username": ADMIN,
        "admin_password": password_file.read_text().strip(),
        "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
        # Every request carries its user's password, which MLflow checks with a deliberately slow
        # hash: on a sweep's writes that took a fifth of a core. Its own cache keeps a password
        # it has checked for a minute; with the one worker, changing or deleting a user through
        # the API still takes effect at once (MLflow clears the cache entry on that worker).
        "auth_cache_ttl_seconds": "60",
    }
    with open(write_private(path, ""), "w") as out:
        config.write(out)


def write_private(path: Path, text: str) -> Path:
    """Create or truncate ``path`` with mode 600 before anything is written into it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


def start(
    backend_uri: str,
    artifacts: str,
    port: int,
    log: Path,
    env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
    timeout: float = 120,
    auth: Path | None = None,
) -> int:
    """Start the server in its own session and wait until it answers; returns its pid. ``auth``:
    the basic-auth app's config file, to require users and passwords."""
    if "://" not in artifacts:  # a bucket's root is the bucket's business
        Path(artifacts).mkdir(parents=True, exist_ok=True)
    # The basic-auth app signs its sign-up form with this key; one worker, so a key per start will do.
    auth_env = {"MLFLOW_AUTH_CONFIG_PATH": str(auth), "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32)}
    pid = spawn(
        argv(backend_uri, artifacts, port, host, auth is not None),
        log,
        env={
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            **(auth_env if auth else {}),
            **(env or {}),
        },
    )
    wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health"), timeout, f"the MLflow server on port {port}", log)
    return pid
