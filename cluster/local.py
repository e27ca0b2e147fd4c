"""``seqae cluster up/down/status``: a real multi-node Ray cluster on one machine, with the
PostgreSQL and MLflow server a multi-node sweep needs.

``up`` starts a Ray head and N worker raylets, each its own node on its own loopback address
(127.0.0.2, 127.0.0.3, ...), with token authentication on and the dashboard bound to 127.0.0.1;
a PostgreSQL server on 127.0.0.1 with databases for MLflow and Optuna; an MLflow server on
127.0.0.1 backed by it, with MLflow's authentication on (its users in PostgreSQL too); and a
shared storage folder for checkpoints, Tune state and artifacts. It writes ``env.sh`` with what a
user exports to submit sweeps to it. Secrets (the Ray token, the database password, the MLflow
admin's password) live in ``secrets/`` (mode 700), each in a file of mode 600, and are never
printed: ``env.sh`` reads the MLflow password from its file. The Ray head holds no password in
its environment: it names the folder of the users' MLflow passwords (:mod:`cluster.accounts`),
from which the driver of a submitted sweep (which runs on the head) signs in as its job's user,
so no password ever enters a job's runtime environment.

Every node starts with an allow-listed environment, not the starter's shell: a Ray job may run
any command on the head (``ray job submit -- env``), so whatever a node holds, every job holds.
A node gets the few names a process needs (:data:`SYSTEM_ENV`), seqae's own settings
(:func:`_ray_env`), and the names the operator passes on purpose (``up --pass-env NAME``: the
storage's credentials, the Hugging Face Hub's offline settings).

``up --gpus-per-worker N`` starts each worker with N GPUs (``ray start --num-gpus=N``): on a
machine without them they are logical, a rehearsal of GPU scheduling whose trials train on the
CPU only where the sweep opts in with ``SEQAE_LOGICAL_GPUS=1`` (``sweeps.running.trial.trial_device``).

``down`` stops only what ``up`` started (the processes it recorded, and the Ray processes under
its own temporary folder) and keeps the data: a later ``up`` on the same folder brings the same
database, storage and ports back, so an interrupted sweep can be resumed on the fresh cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypedDict

import psutil

from cluster import accounts, artifact_store, mlflow_server, postgres
from cluster.procs import alive_group, free_port, free_port_block, http_ok, stop_group, wait_until
from cluster.state import MLFLOW_PASSWORD, RAY_TOKEN, SECRETS, ClusterState, MlflowService, read_state, write_state
from seqae_errors import ConfigError

AUTH_CONFIG = "mlflow_auth.ini"  # in secrets/: the MLflow server's basic-auth settings
NODE_PORTS = 50  # ports reserved per Ray node: its servers and its worker processes
# Every node's metrics agent would serve Prometheus metrics on every interface, without the token
# (Ray binds it to loopback only where a node's address is 127.0.0.1 itself); nothing here reads
# them. Set on the head, the setting reaches every node's Ray through the GCS.
HEAD_ARGS = ['--system-config={"enable_metrics_collection": false}']
# A lost node is noticed in about 3 s instead of about 15 s (what the tests and users wait for).
FAST_HEALTH_CHECKS = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
# What any process of a node needs from the starter's shell, none of it a secret: where programs
# and libraries are, whose home, the locale and time zone, the temporary folder, which certificate
# authorities TLS trusts, and which GPUs the operator gave the node. Everything else reaches a node
# only by name (``up --pass-env``).
SYSTEM_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CUDA_VISIBLE_DEVICES",
)
SYSTEM_PREFIXES = ("LC_",)


def _ray_bin() -> str:
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else "ray"


def node_cache(state: ClusterState, ip: str) -> Path:
    """Node ``ip``'s own data cache: as on machines that share no disk, each node fetches the data
    a sweep's driver published into its own cache (``seqae_core.data``)."""
    return Path(state.root) / "nodes" / ip / "cache"


def _ray_env(state: ClusterState, ip: str) -> dict[str, str]:
    """Node ``ip``'s whole environment: :data:`SYSTEM_ENV` and the names ``up --pass-env`` gave,
    from this process's, then seqae's own settings."""
    passed = set(state.pass_env)
    chosen = {k: v for k, v in os.environ.items() if k in SYSTEM_ENV or k.startswith(SYSTEM_PREFIXES) or k in passed}
    return {
        **chosen,
        "SEQAE_CACHE_DIR": str(node_cache(state, ip)),
        **FAST_HEALTH_CHECKS,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": state.token_file,
        "RAY_USAGE_STATS_ENABLED": "0",
        # the job driver and the trials find this venv's python first
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PGPASSFILE": state.postgres.pgpass_of("optuna"),  # the drivers' studies
    }


def node_args(ip: str, base: int, cpus: int | None, gpus: int | None = None) -> list[str]:
    """A node's own ports, all in [base, base + NODE_PORTS): several nodes share the machine. Its
    CPUs and GPUs are those Ray detects, or ``cpus`` and ``gpus`` (logical GPUs, where the machine
    has fewer).

    The dashboard agent's HTTP port, the runtime-env agent and the client server listen on the
    node's address. Ray's gRPC servers (raylet, object manager, the agent's gRPC port, workers;
    the GCS) and the head's dashboard and autoscaler metrics listen on every interface wherever
    the node's address is not 127.0.0.1 itself, and no option binds them elsewhere; the gRPC
    servers ask for the cluster's token. No metrics export port is given: the head turns the
    nodes' metrics export off (``HEAD_ARGS``)."""
    return [
        f"--node-ip-address={ip}",
        *([f"--num-cpus={cpus}"] if cpus is not None else []),
        *([f"--num-gpus={gpus}"] if gpus is not None else []),
        f"--node-manager-port={base}",
        f"--object-manager-port={base + 1}",
        f"--dashboard-agent-listen-port={base + 2}",
        f"--dashboard-agent-grpc-port={base + 3}",
        f"--runtime-env-agent-port={base + 4}",
        f"--min-worker-port={base + 10}",
        f"--max-worker-port={base + NODE_PORTS - 2}",
        "--disable-usage-stats",
    ]


def environment(state: ClusterState) -> dict[str, str]:
    """What a user exports to submit sweeps to this cluster: secrets only by their files' names
    (the MLflow password is in :func:`mlflow_credentials`)."""
    ray = (
        {
            "SEQAE_RAY_ADDRESS": f"http://127.0.0.1:{state.dashboard_port}",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": state.token_file,
        }
        if state.ray
        else {}
    )
    return {
        **ray,
        "SEQAE_MLFLOW_TRACKING_URI": f"http://127.0.0.1:{state.mlflow.port}",
        "MLFLOW_TRACKING_USERNAME": mlflow_server.ADMIN,
        "SEQAE_OPTUNA_STORAGE": state.postgres.url("optuna"),
        "PGPASSFILE": state.postgres.pgpass_of("optuna"),  # the studies' role, no other
        "SEQAE_STORAGE": state.storage,
        "SEQAE_WORKSPACE": state.workspace,
        "SEQAE_CLUSTER_WORKSPACE": state.workspace,  # a submitted driver's, whatever the shell's own
    }


def mlflow_credentials(state: ClusterState) -> dict[str, str]:
    """The MLflow admin's name and password, as MLflow's client reads them from the environment."""
    return {
        "MLFLOW_TRACKING_USERNAME": mlflow_server.ADMIN,
        "MLFLOW_TRACKING_PASSWORD": Path(state.mlflow.password_file).read_text().strip(),
    }


def _env_sh(state: ClusterState) -> str:
    """``environment`` as shell exports, and the MLflow password read from its file when sourced."""
    lines = [f"export {k}={shlex.quote(v)}\n" for k, v in environment(state).items()]
    password_file = shlex.quote(state.mlflow.password_file)
    return "".join(lines) + f'export MLFLOW_TRACKING_PASSWORD="$(cat {password_file})"\n'


def up(
    root: Path,
    workers: int = 2,
    cpus_per_worker: int = 1,
    head_cpus: int = 0,
    ray: bool = True,
    storage: str | None = None,
    gpus_per_worker: int | None = None,
    pass_env: tuple[str, ...] = (),
) -> ClusterState:
    """Start the cluster in ``root`` (reusing its database and ports if it ran there before).

    Without ``ray``, only PostgreSQL and the MLflow server start: for a head node whose Ray is
    started by a cluster launcher (see ``aws.yaml``). ``gpus_per_worker`` (None: the GPUs Ray
    detects) is recorded in the state, and every worker started later gets as many. ``pass_env``:
    the names of this environment every node gets beside :data:`SYSTEM_ENV` (recorded, for the
    workers started later; a later ``up`` passes its own)."""
    root = root.resolve()
    previous = read_state(root)
    storage = _checked(root, previous, ray, workers, gpus_per_worker, storage, pass_env)
    secrets_dir = _secrets(root, ray)
    # MLflow's users live in a database of their own beside the runs: with the runs they grant
    # access to, in one server that is backed up and restarted together (a SQLite file would be a
    # second store to keep, and locks under several server workers).
    password_file = str(secrets_dir / MLFLOW_PASSWORD)
    if previous:
        state = replace(
            previous,
            workers=workers,
            cpus_per_worker=cpus_per_worker,
            head_cpus=head_cpus,
            gpus_per_worker=gpus_per_worker,
            pass_env=list(pass_env),
            mlflow=replace(previous.mlflow, password_file=password_file),
            pids={},
            ray=ray,
            ray_temp_dir=tempfile.mkdtemp(prefix="seqae-ray-"),  # short: Ray's socket paths are limited
            ray_sessions=[],
        )
    else:
        state = ClusterState(
            root=str(root),
            token_file=str(secrets_dir / RAY_TOKEN),
            workers=workers,
            cpus_per_worker=cpus_per_worker,
            head_cpus=head_cpus,
            gpus_per_worker=gpus_per_worker,
            pass_env=list(pass_env),
            gcs_port=free_port(),
            dashboard_port=free_port(),
            node_ports=free_port_block(NODE_PORTS * (workers + 1)),
            mlflow=MlflowService(port=free_port(), password_file=password_file),
            postgres=postgres.create(secrets_dir, free_port()),
            storage=storage or str(root / "storage"),
            workspace=str(root / "workspace"),
            ray=ray,
            ray_temp_dir=tempfile.mkdtemp(prefix="seqae-ray-"),
        )
    write_state(root, state)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    for folder in (state.storage, state.workspace):
        if "://" not in folder:
            Path(folder).mkdir(parents=True, exist_ok=True)

    postgres.start(state.postgres, logs / "postgres.log")
    mlflow_server.write_auth_config(
        secrets_dir / AUTH_CONFIG, Path(state.mlflow.password_file), state.postgres.url("mlflow_auth")
    )
    start_mlflow(state)
    accounts.admin_account(state)

    if ray:
        _start_ray(state, logs)
    state.started = time.time()
    write_state(root, state)
    (root / "env.sh").write_text(_env_sh(state))
    return state


def _checked(
    root: Path,
    previous: ClusterState | None,
    ray: bool,
    workers: int,
    gpus_per_worker: int | None,
    storage: str | None,
    pass_env: tuple[str, ...],
) -> str | None:
    """``up``'s arguments checked before anything is created; a storage folder made absolute."""
    if previous and any(alive for alive in _liveness(previous).values()):
        raise ConfigError(f"a cluster is already running from {root}; `seqae cluster down --dir {root}` first")
    if ray and workers < 1:
        raise ConfigError(f"--workers={workers} must be at least 1 (a head and workers make a multi-node cluster)")
    if gpus_per_worker is not None and gpus_per_worker < 0:
        raise ConfigError(f"--gpus-per-worker={gpus_per_worker} must be 0 or more")
    if storage is not None and "://" not in storage:
        storage = str(Path(storage).expanduser().resolve())  # the server and the nodes start elsewhere
    if previous and storage is not None and storage != previous.storage:
        raise ConfigError(
            f"--storage {storage}: the services in {root} keep their checkpoints and MLflow's artifacts in "
            f"{previous.storage}; start them without --storage, or in another --dir"
        )
    artifact_store.check(storage or (previous.storage if previous else ""))
    for name in pass_env:
        if name not in os.environ:
            raise ConfigError(
                f"--pass-env {name}: {name} is not set in this shell (each node gets its value from here)"
            )
    return storage


def _secrets(root: Path, ray: bool) -> Path:
    """The cluster's folder of secrets, readable by its owner alone, with the token of the Ray ``up`` starts."""
    secrets_dir = root / SECRETS
    secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(secrets_dir, 0o700)
    token_file = secrets_dir / RAY_TOKEN  # the Ray it starts; beside a Ray started by hand, that Ray's own
    if ray and not token_file.exists():
        token_file.write_text(secrets.token_urlsafe(32))
        token_file.chmod(0o600)
    return secrets_dir


def start_mlflow(state: ClusterState) -> None:
    """Start the MLflow server (again, after it stopped) on PostgreSQL, with its authentication,
    and record its process."""
    root = Path(state.root)
    pg = state.postgres
    state.pids["mlflow"] = mlflow_server.start(
        pg.url("mlflow"),
        artifact_store.artifact_root(state.storage),
        state.mlflow.port,
        root / "logs" / "mlflow.log",
        env={"PGPASSFILE": pg.pgpass_of("mlflow")},
        auth=root / SECRETS / AUTH_CONFIG,
    )
    write_state(root, state)


def _start_ray(state: ClusterState, logs: Path) -> None:
    """A head on 127.0.0.2 and worker raylets on 127.0.0.3, 127.0.0.4, ...: one node each."""
    # Sweep drivers run on the head (Ray's default for jobs) and inherit its environment: it names
    # the folder of the users' MLflow passwords, where a driver signs in as the user who submitted
    # its sweep; no password is in the environment, and none enters a job's runtime environment.
    env = {**_ray_env(state, "127.0.0.2"), accounts.ACCOUNTS_ENV: str(accounts.accounts_dir(state))}
    head = [
        _ray_bin(),
        "start",
        "--head",
        f"--port={state.gcs_port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={state.dashboard_port}",
        f"--temp-dir={state.ray_temp_dir}",
        f"--ray-client-server-port={state.node_ports + NODE_PORTS - 1}",
        *HEAD_ARGS,
        *node_args("127.0.0.2", state.node_ports, state.head_cpus),
    ]
    _ray_start(state, head, env, logs / "ray-head.log")
    for i in range(1, state.workers + 1):
        start_worker(state, i)
    wait_until(
        lambda: http_ok(f"http://127.0.0.1:{state.dashboard_port}/api/gcs_healthz"),
        60,
        "the Ray dashboard",
        logs / "ray-head.log",
    )


def start_worker(state: ClusterState, i: int) -> None:
    """Start worker node ``i`` (1-based) on 127.0.0.<2 + i>: again, after it was lost."""
    ip = f"127.0.0.{2 + i}"
    worker = [
        _ray_bin(),
        "start",
        f"--address=127.0.0.2:{state.gcs_port}",
        f"--temp-dir={state.ray_temp_dir}",
        *node_args(ip, state.node_ports + NODE_PORTS * i, state.cpus_per_worker, state.gpus_per_worker),
    ]
    log = Path(state.root) / "logs" / f"ray-worker-{i}.log"
    _ray_start(state, worker, _ray_env(state, ip), log)


def _ray_start(state: ClusterState, argv: list[str], env: dict[str, str], log: Path) -> None:
    """Run `ray start` in a session of its own, recorded in the state: whatever Ray starts under
    it stays in that session, where ``down`` finds it."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    state.ray_sessions.append(proc.pid)
    write_state(Path(state.root), state)
    if proc.wait(timeout=180) != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"`ray start` failed ({log}):\n{tail}")


def ray_processes(temp_dir: str, sessions: Collection[int]) -> list[psutil.Process]:
    """The Ray processes of one cluster, whose Ray keeps ``temp_dir`` and whose `ray start` commands
    ran in ``sessions``: those in those sessions, whatever Ray started under them (a
    ray.util.client.server, agents that renamed themselves), and those that name the folder."""
    sessions = set(sessions)
    return [
        p
        for p in psutil.process_iter(["cmdline", "environ"])
        if temp_dir  # an empty name is in every command line
        and p.pid != os.getpid()
        and (
            _session(p.pid) in sessions
            or temp_dir in " ".join(p.info["cmdline"] or ())
            or any(temp_dir in v for v in (p.info["environ"] or {}).values())
        )
    ]


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # gone meanwhile
        return None


def worker_raylets(state: ClusterState) -> dict[str, int]:
    """``{node ip: raylet pid}`` of the worker nodes (for killing exactly one, in tests)."""
    raylets = {}
    for proc in ray_processes(state.ray_temp_dir, state.ray_sessions):
        cmdline = proc.info["cmdline"] or [""]
        ips = [a.split("=", 1)[1] for a in cmdline if a.startswith("--node_ip_address=")]
        if cmdline[0].endswith("raylet") and ips and ips[0] != "127.0.0.2":
            raylets[ips[0]] = proc.pid
    return raylets


def down(root: Path) -> list[str]:
    """Stop what ``up`` started in ``root``; the data stays."""
    root = root.resolve()
    state = read_state(root)
    if state is None:
        raise ConfigError(f"no cluster was started from {root}")
    stopped = []
    procs = found = ray_processes(state.ray_temp_dir, state.ray_sessions)
    for signal in ("terminate", "kill"):  # SIGTERM; SIGKILL for what is left after 15 s
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                getattr(proc, signal)()
        procs = psutil.wait_procs(procs, timeout=15)[1]
    if found:
        stopped.append(f"Ray ({len(found)} processes)")
    mlflow_pid = state.pids.get("mlflow")
    if mlflow_pid is not None and alive_group(mlflow_pid):
        stop_group(mlflow_pid)
        stopped.append("MLflow server")
    if postgres.running(state.postgres):
        postgres.stop(state.postgres)
        stopped.append("PostgreSQL")
    shutil.rmtree(state.ray_temp_dir or "/nonexistent", ignore_errors=True)
    state.pids, state.ray_sessions = {}, []
    write_state(root, state)
    return stopped


def _liveness(state: ClusterState) -> dict[str, bool]:
    return {
        "ray": state.ray and http_ok(f"http://127.0.0.1:{state.dashboard_port}/api/gcs_healthz"),
        "mlflow": "mlflow" in state.pids and http_ok(f"http://127.0.0.1:{state.mlflow.port}/health"),
        "postgres": postgres.running(state.postgres),
    }


def add_user(root: Path, name: str) -> tuple[Path, str]:
    """``seqae cluster add-user NAME``: an MLflow account for ``name`` (:mod:`cluster.accounts`);
    returns the folder to give them and the SSH tunnel their machine opens to the head."""
    state = read_state(root.resolve())
    if state is None:
        raise ConfigError(f"no cluster was started from {root.resolve()}")
    exports = environment(state)
    return accounts.add_user(state, name, exports), accounts.tunnel_command(state, exports)


@dataclass(frozen=True)
class MlflowStore:
    """What the cluster's admin needs to purge in MLflow's own database (``seqae cluster gc``): its
    backend URI (role ``seqae_mlflow``), the server (whose ``mlflow-artifacts:/`` URIs resolve
    there) and the environment that signs in to both: the role's pgpass file, the admin's MLflow
    name and password."""

    backend_uri: str
    tracking_uri: str
    env: dict[str, str]


def mlflow_store(root: Path) -> MlflowStore:
    """The MLflow store of the cluster started from ``root``, whose server must be running."""
    state = read_state(root.resolve())
    if state is None:
        raise ConfigError(f"no cluster was started from {root.resolve()}")
    if not _liveness(state)["mlflow"]:
        raise ConfigError(
            f"the MLflow server of {root.resolve()} is not running: `seqae cluster up --dir {root}` "
            "(or `services`) first"
        )
    pg = state.postgres
    return MlflowStore(
        pg.url("mlflow"),
        f"http://127.0.0.1:{state.mlflow.port}",
        {"PGPASSFILE": pg.pgpass_of("mlflow"), **mlflow_credentials(state)},
    )


class Node(TypedDict):
    """A node as Ray's dashboard lists it."""

    ip: str | None
    state: str | None  # ALIVE, DEAD
    node_id: str | None


class _Status(TypedDict):
    root: str
    services: dict[str, bool]  # each service: whether it answers
    environment: dict[str, str]  # as :func:`environment`


class ClusterStatus(_Status, total=False):
    """``seqae cluster status``'s document (it prints it as JSON)."""

    nodes: list[Node]  # where its Ray answers


def status(root: Path) -> ClusterStatus:
    root = root.resolve()
    state = read_state(root)
    if state is None:
        raise ConfigError(f"no cluster was started from {root}")
    alive = _liveness(state)
    if not state.ray:
        del alive["ray"]
    info = ClusterStatus(root=str(root), services=alive, environment=environment(state))
    if alive.get("ray"):
        info["nodes"] = alive_nodes(state.dashboard_port, state.token_file)
    return info


def alive_nodes(dashboard_port: int, token_file: str) -> list[Node]:
    """Alive nodes, through the dashboard's API on ``dashboard_port`` (with the token in ``token_file``)."""
    token = Path(token_file).read_text().strip()
    request = urllib.request.Request(
        f"http://127.0.0.1:{dashboard_port}/nodes?view=summary", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            summary = json.loads(response.read())["data"]["summary"]
    except (OSError, ValueError, KeyError):
        return []
    return [
        Node(ip=n.get("ip"), state=n.get("raylet", {}).get("state"), node_id=n.get("raylet", {}).get("nodeId"))
        for n in summary
    ]
