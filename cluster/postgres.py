"""A private PostgreSQL server on loopback, for a cluster's MLflow server (runs, and its users and
permissions) and Optuna study.

Least privilege: the superuser ``seqae`` that ``initdb`` makes is the cluster's own, used only by
``seqae cluster`` to create databases and roles. Each purpose has a role of its own that is no
superuser and owns only its databases (:data:`ROLES`): ``seqae_optuna`` the studies, which the
users' shells and the sweep drivers reach; ``seqae_mlflow`` MLflow's runs and its users and
permissions, which only the MLflow server reaches. So a user's credentials cannot rewrite MLflow's
users, read another database or run OS commands as the server (``COPY ... TO PROGRAM`` needs a
superuser).

Every password is generated, never printed, and kept in a pgpass file (mode 600) that clients
name with ``PGPASSFILE``: the superuser's in ``pgpass``, each role's in ``pgpass-<purpose>``
beside it; URLs carry no secret. As root, the server runs as the ``postgres`` system user, since
PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from seqae_errors import ConfigError

ROLE = "seqae"  # the superuser: the cluster's own, never handed to a user or a server
# purpose -> (its role, the databases it owns); every database belongs to exactly one purpose
ROLES = {"optuna": ("seqae_optuna", ("optuna",)), "mlflow": ("seqae_mlflow", ("mlflow", "mlflow_auth"))}
DATABASES = tuple(db for _, databases in ROLES.values() for db in databases)


@dataclass
class Postgres:
    data_dir: str
    port: int
    pgpass: str  # a pgpass file with the superuser's password
    run_as: str | None  # the OS user the server runs as (None: the current one)

    def url(self, database: str, purpose: str | None = None) -> str:
        """``database`` through the role of ``purpose`` (unset: the one :data:`ROLES` gives it)."""
        # The driver named: SQLAlchemy 2.0 defaults to psycopg2 and 2.1 to psycopg (3).
        return f"postgresql+psycopg://{ROLES[purpose or purpose_of(database)][0]}@127.0.0.1:{self.port}/{database}"

    def pgpass_of(self, purpose: str) -> str:
        """The pgpass file with the password of ``purpose``'s role (and no other)."""
        return str(Path(self.pgpass).with_name(f"pgpass-{purpose}"))


DEBIAN_VERSIONS = Path("/usr/lib/postgresql")  # Debian's servers, one folder per major version


def purpose_of(database: str) -> str:
    return next(purpose for purpose, (_, databases) in ROLES.items() if database in databases)


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
        _run(
            [
                str(bindir() / "initdb"),
                "-D",
                str(base / "data"),
                "-U",
                ROLE,
                "-A",
                "scram-sha-256",
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--no-locale",
            ],
            run_as,
        )
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
    _run(
        [
            str(bindir() / "pg_ctl"),
            "-D",
            pg.data_dir,
            "-l",
            str(log),
            "-w",
            "-t",
            "60",
            "-o",
            f"-c listen_addresses=127.0.0.1 -p {pg.port} -k {socket_dir}",
            "start",
        ],
        pg.run_as,
    )
    existing = _psql(pg, "SELECT datname FROM pg_database").split()
    for database in DATABASES:
        if database not in existing:
            create_database(pg, database)
    ensure_roles(pg)


def create_database(pg: Postgres, name: str, purpose: str | None = None) -> None:
    """A new database; with ``purpose``, its role's (see :func:`hand_over`)."""
    _psql(pg, f"CREATE DATABASE {name}")
    if purpose is not None:
        hand_over(pg, name, purpose)


def ensure_roles(pg: Postgres) -> None:
    """Each purpose's role, with a password in its own pgpass file, owning its databases and
    everything in them. Idempotent: a cluster made before the roles existed (its tables the
    superuser's) is handed over on its next start, and a role whose pgpass file is gone gets a
    new password."""
    # the maintenance database is the superuser's alone, as every other database is its role's
    _psql(pg, "REVOKE ALL ON DATABASE postgres FROM PUBLIC")
    roles = set(_psql(pg, "SELECT rolname FROM pg_roles").split())
    for purpose, (role, databases) in ROLES.items():
        pgpass = Path(pg.pgpass_of(purpose))
        if role not in roles or not pgpass.exists():
            password = secrets.token_urlsafe(24)
            verb = "ALTER" if role in roles else "CREATE"
            # no SUPERUSER, CREATEDB, CREATEROLE or REPLICATION: a role that only logs in
            _psql(
                pg, f"{verb} ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD '{password}'"
            )
            fd = os.open(pgpass, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(f"127.0.0.1:{pg.port}:*:{role}:{password}\n")  # the role reaches only its own
        for database in databases:
            hand_over(pg, database, purpose)


def hand_over(pg: Postgres, database: str, purpose: str) -> None:
    """Make ``database`` and everything in it the role of ``purpose``'s, reachable by no other role."""
    role = ROLES[purpose][0]
    _psql(pg, f"ALTER DATABASE {database} OWNER TO {role}")
    # PUBLIC may connect to a new database by default: only its owner (and the superuser) may
    _psql(pg, f"REVOKE ALL ON DATABASE {database} FROM PUBLIC")
    _psql(pg, _HAND_OVER.format(role=role), database)


# What the superuser made in a database before its role existed becomes the role's: tables (with
# the sequences they own), views, free sequences and enum types of the public schema. PostgreSQL
# 15's public schema belongs to the database's owner, so the role may create tables there.
_HAND_OVER = """DO $$DECLARE r record; BEGIN
FOR r IN SELECT format('ALTER %s public.%I OWNER TO {role}', CASE c.relkind WHEN 'v' THEN 'VIEW'
    WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, c.relname) AS q
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'S') AND c.relowner <> '{role}'::regrole
    AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid
             AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')))
LOOP EXECUTE r.q; END LOOP;
FOR r IN SELECT format('ALTER TYPE public.%I OWNER TO {role}', t.typname) AS q
  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
  WHERE n.nspname = 'public' AND t.typtype = 'e' AND t.typowner <> '{role}'::regrole
LOOP EXECUTE r.q; END LOOP;
END$$"""


def stop(pg: Postgres) -> None:
    if Path(pg.data_dir, "postmaster.pid").exists():
        _run([str(bindir() / "pg_ctl"), "-D", pg.data_dir, "-m", "fast", "-w", "stop"], pg.run_as)


def running(pg: Postgres) -> bool:
    try:
        _psql(pg, "SELECT 1")
        return True
    except RuntimeError:
        return False


def _psql(pg: Postgres, sql: str, database: str = "postgres") -> str:
    """``sql`` as the superuser."""
    # on standard input, not the command line, where `ps` would show a role's new password
    result = subprocess.run(
        [
            str(bindir() / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(pg.port),
            "-U",
            ROLE,
            "-d",
            database,
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
        ],
        input=sql,
        capture_output=True,
        text=True,
        env={**os.environ, "PGPASSFILE": pg.pgpass, "PGCONNECT_TIMEOUT": "3"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"psql: {result.stderr.strip()}")
    return result.stdout
