"""A private PostgreSQL server on loopback, for a cluster's MLflow server (runs, and its users and
permissions) and Optuna study.

The password is generated, never printed, and kept in a pgpass file (mode 600) that clients
name with ``PGPASSFILE``; URLs carry no secret. As root, the server runs as the ``postgres``
system user, since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from seqae_errors import ConfigError

ROLE = "seqae"
DATABASES = ("mlflow", "mlflow_auth", "optuna")


@dataclass
class Postgres:
    data_dir: str
    port: int
    pgpass: str  # a pgpass file with the role's password
    run_as: str | None  # the OS user the server runs as (None: the current one)

    def url(self, database: str) -> str:
        # The driver named: SQLAlchemy 2.0 defaults to psycopg2 and 2.1 to psycopg (3).
        return f"postgresql+psycopg://{ROLE}@127.0.0.1:{self.port}/{database}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


DEBIAN_VERSIONS = Path("/usr/lib/postgresql")  # Debian's servers, one folder per major version


def bindir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` live (Debian keeps them out of PATH)."""
    if shutil.which("pg_config"):
        candidate = Path(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip())
        if (candidate / "pg_ctl").exists():
            return candidate
    found = sorted(DEBIAN_VERSIONS.glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    if shutil.which("pg_ctl"):
        return Path(shutil.which("pg_ctl")).parent  # type: ignore[arg-type]
    raise ConfigError("PostgreSQL is not installed (on Debian: apt-get install postgresql-15)")


def _run(argv: list[str], run_as: str | None, env: dict[str, str] | None = None) -> None:
    if run_as is not None:
        argv = ["runuser", "-u", run_as, "--", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} failed: {result.stderr.strip() or result.stdout.strip()}")


def create(secrets_dir: Path, port: int) -> Postgres:
    """initdb a new server with a generated password (not yet started)."""
    run_as = "postgres" if os.geteuid() == 0 else None
    # The server's own files must be reachable by its user: as root, outside root-only folders.
    base = Path(tempfile.mkdtemp(prefix="seqae-pg-")) if run_as else secrets_dir.parent / "postgres"
    base.mkdir(parents=True, exist_ok=True)
    if run_as:
        shutil.chown(base, run_as)
    password = secrets.token_urlsafe(24)
    pwfile = base / "initdb.pw"
    pwfile.write_text(password + "\n")
    pwfile.chmod(0o600)
    if run_as:
        shutil.chown(pwfile, run_as)
    try:
        _run([str(bindir() / "initdb"), "-D", str(base / "data"), "-U", ROLE, "-A", "scram-sha-256",
              f"--pwfile={pwfile}", "-E", "UTF8", "--no-locale"], run_as)
    finally:
        pwfile.unlink(missing_ok=True)
    pgpass = secrets_dir / "pgpass"
    secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    pgpass.write_text(f"127.0.0.1:{port}:*:{ROLE}:{password}\n")
    pgpass.chmod(0o600)
    return Postgres(data_dir=str(base / "data"), port=port, pgpass=str(pgpass), run_as=run_as)


def start(pg: Postgres, log: Path) -> None:
    """Start the server on 127.0.0.1 only and create the databases that are missing."""
    socket_dir = Path(pg.data_dir).parent
    if pg.run_as:
        log = socket_dir / "postgres.log"  # a file its own user may write
    _run([str(bindir() / "pg_ctl"), "-D", pg.data_dir, "-l", str(log), "-w", "-t", "60", "-o",
          f"-c listen_addresses=127.0.0.1 -p {pg.port} -k {socket_dir}", "start"], pg.run_as)
    existing = _psql(pg, "SELECT datname FROM pg_database").split()
    for database in DATABASES:
        if database not in existing:
            create_database(pg, database)


def create_database(pg: Postgres, name: str) -> None:
    _psql(pg, f"CREATE DATABASE {name}")


def stop(pg: Postgres) -> None:
    if Path(pg.data_dir, "postmaster.pid").exists():
        _run([str(bindir() / "pg_ctl"), "-D", pg.data_dir, "-m", "fast", "-w", "stop"], pg.run_as)


def running(pg: Postgres) -> bool:
    try:
        _psql(pg, "SELECT 1")
        return True
    except RuntimeError:
        return False


def _psql(pg: Postgres, sql: str) -> str:
    result = subprocess.run(
        [str(bindir() / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", ROLE, "-d", "postgres", "-At", "-c", sql],
        capture_output=True, text=True, env={**os.environ, "PGPASSFILE": pg.pgpass, "PGCONNECT_TIMEOUT": "3"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"psql: {result.stderr.strip()}")
    return result.stdout
