"""Running the real `seqae sweep` commands on tiny settings, and reading what they left behind."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from filelock import FileLock

from cluster.procs import free_port
from seqae_core.checkpoint import CheckpointStore
from tests.conftest import REPO, WIKI_MINI, stop_local_ray

STUDIES = REPO / "sweeps" / "studies"

# Tiny sizes for any study: a few real pages, a small model, two epochs, one trial at a time (a
# second trial's worker costs a sweep about 11 CPU-seconds of imports: the tests that need trials
# side by side ask for them).
SMOKE = [
    f"data.path={WIKI_MINI}",
    "data.max_pages=6",
    "data.samples=windows",
    "model.d_model=16",
    "model.d_attn=16",
    "model.d_ffn=32",
    "train.epochs=2",
    "train.batch_size=64",
    "resources.cpu=1",
    "max_concurrent=1",
    "scheduler.type=none",  # every trial runs all its epochs: the tests count, compare and interrupt them
]


# Smaller still: five pages of 16 tokens, halved to 8; a point of the loss curve every 3 steps.
TINY = [*SMOKE, "data.max_pages=5", "data.input_len=16", "model.latent_len=8", "train.log_every_steps=3"]


PYTHON_PAGE = REPO / "docs" / "how-to" / "python.md"
CLUSTER_PART = "## On a Ray cluster"


def python_page(cluster: bool, tiny: list[str]) -> str:
    """docs/how-to/python.md's Python blocks in order, those before its cluster part or (``cluster``)
    those after it, the part's one list of overrides replaced by ``tiny``."""
    local, _, remote = PYTHON_PAGE.read_text().partition(CLUSTER_PART)
    assert remote, f"the page has no part {CLUSTER_PART!r}"
    code = "\n".join(re.findall(r"```python\n(.*?)```", remote if cluster else local, re.S))
    code, replaced = re.subn(r'set=\["data\.path=[^"]*"\]', f"set={tiny!r}", code)
    assert replaced == 1, "the part's one set=[...] is where the test sets the sizes"
    return code


def run_args(workspace: Path, name: str, *extra: str, study: Path = STUDIES / "quickstart.yaml") -> list[str]:
    """`seqae sweep run` of ``study`` on TINY settings, plus ``extra`` overrides."""
    return ["sweep", "run", str(study), "--name", name, "--workspace", str(workspace), *sets(*TINY, *extra)]


# The verbs that drive a sweep or read its status run in the test's own process, as `seqae.api`'s
# users run them in one Python session: their imports (12-15 CPU-seconds per driver) are paid
# once per test process, and their local Ray, started by the first driver, serves the next ones of
# the test module (DRIVERS in a process of their own start their own: conftest.stop_local_ray).
DRIVERS = {("sweep", "run"), ("sweep", "resume"), ("sweep", "extend"), ("sweep", "fork")}
IN_PROCESS = DRIVERS | {("sweep", "status")}


def seqae(
    *args: str,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    unset: tuple[str, ...] = (),
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """A `seqae` command run to its end, from ``cwd``, with ``env`` added to this process's
    environment and the variables ``unset`` names taken out of it. It runs in a process of its
    own where it is not one of the verbs above, where it changes the environment (libraries read
    theirs when imported) or runs from another folder than this process, where RAY_ADDRESS names
    a cluster, or where ``fresh`` asks for one
    (to see everything a new process prints: Python's warnings, libraries' lines on stderr)."""
    if (
        tuple(args[:2]) in IN_PROCESS
        and not (env or unset or fresh)
        and Path.cwd() == cwd
        and "RAY_ADDRESS" not in os.environ
    ):
        return in_process(list(args), timeout)
    _ray_of_its_own(args, env)
    environment = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "-m", "seqae", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
        cwd=cwd,
    )


def _ray_of_its_own(args: tuple[str, ...], env: dict[str, str] | None) -> None:
    """A driver in a process of its own starts a local Ray of its own, unless RAY_ADDRESS names a
    cluster: this process's goes first."""
    if tuple(args[:2]) in DRIVERS and "RAY_ADDRESS" not in {**os.environ, **(env or {})}:
        stop_local_ray()


def in_process(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`seqae.cli.main.main(argv)` in this process, with what its own process would give it: its
    stdout and stderr (seqae's log lines, Ray's forwarded trial lines, a traceback as Python prints
    one, exit code 1), this process's environment and SIGINT and SIGTERM handlers as they were
    before it, and a SIGINT at ``timeout`` (the driver's Ctrl-C) where a subprocess would have been
    killed."""
    from seqae.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(message)s"))  # as main's basicConfig formats them
    root, level = logging.getLogger(), logging.getLogger().level
    on_signal = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    environment = dict(os.environ)
    overran: list[str] = []

    def ctrl_c() -> None:  # where the verb was when it ran past its time, then the driver's Ctrl-C
        frames = sys._current_frames()
        overran.extend(
            f"{t.name}:\n{''.join(traceback.format_stack(frames[t.ident]))}"
            for t in threading.enumerate()
            if t.ident in frames
        )
        os.kill(os.getpid(), signal.SIGINT)

    watchdog = threading.Timer(timeout, ctrl_c)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    watchdog.start()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException as exc:  # noqa: BLE001 - what an uncaught exception does to a process
                if isinstance(exc, KeyboardInterrupt) and not watchdog.finished.is_set():
                    raise  # the person running the tests pressed Ctrl-C
                traceback.print_exc()
                code = 1
    finally:
        watchdog.cancel()
        root.removeHandler(handler)
        root.setLevel(level)
        for sig, previous in on_signal.items():
            signal.signal(sig, previous)
        if os.environ != environment:
            os.environ.clear()
            os.environ.update(environment)
        gc.unfreeze()  # the verbs freeze what they imported, for a process that ends with them
    if overran:  # said in the run's warnings summary, with its threads' stacks, whatever the test makes of it
        warnings.warn(
            f"`seqae {' '.join(argv)}` ran past {timeout:.0f} s and was sent SIGINT; its threads then:\n"
            + "\n".join(overran),
            stacklevel=2,
        )
    return subprocess.CompletedProcess(["seqae", *argv], code, out.getvalue(), err.getvalue())


def start(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A `seqae` command in the background, in its own process group, output to ``log``."""
    _ray_of_its_own(args, env)
    return subprocess.Popen(
        [sys.executable, "-m", "seqae", *args],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def trial_metas(storage: Path) -> dict[int, dict[str, Any]]:
    """The newest readable checkpoint manifest of each trial under a sweep's storage: {trial: meta}."""
    metas = {}
    for number in CheckpointStore.trials(str(storage)):
        meta = CheckpointStore.of_trial(str(storage), number).newest_meta()
        if meta is not None:
            metas[number] = meta
    return metas


def finished(storage: Path) -> set[int]:
    return {n for n, meta in trial_metas(storage).items() if meta["finished"]}


def sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def status(name: str, workspace: Path) -> dict[str, Any]:
    run = seqae("sweep", "status", name, "--json", "--workspace", str(workspace))
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def wait_for(
    predicate, timeout: float, what: str, every: float = 0.5, explain: Callable[[], str] | None = None
) -> None:
    """Poll ``predicate`` until it holds; past ``timeout``, fail saying ``what`` was awaited, and what
    ``explain()`` says of why (e.g. :func:`stacks` of the process that should have ended)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" + (f"\n{explain()}" if explain else ""))


def stacks(pid: int) -> str:
    """Every thread's Python stack in process ``pid`` and its children (``py-spy dump``), for a
    failure's message: a process that should have ended says where it waits."""
    try:
        dumped = subprocess.run(
            [str(Path(sys.executable).parent / "py-spy"), "dump", "--subprocesses", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"py-spy dump of process {pid} failed: {e}"
    return f"py-spy dump of process {pid}:\n{dumped.stdout}{dumped.stderr}"


def held(driver: subprocess.Popen | psutil.Process, ready: Callable[[], Any]) -> bool:
    """Whether ``ready()`` still holds once ``driver`` is stopped (SIGSTOP), leaving it stopped if
    so: Tune hands a trial's results over in lockstep, so no trial gets past its next epoch's report
    until the driver goes on. If not, the driver goes on (SIGCONT)."""
    if not ready():
        return False
    os.kill(driver.pid, signal.SIGSTOP)
    if ready():
        return True
    os.kill(driver.pid, signal.SIGCONT)
    return False


def drivers(name: str) -> list[psutil.Process]:
    """The running drivers of submitted sweep ``name``: its Ray jobs' entrypoints (the cluster runs on this machine)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = process.info["cmdline"] or []
        named = "--name" in line and line[line.index("--name") + 1] == name  # others' drivers may run here
        if line[1:5] == ["-m", "seqae", "sweep", "run"] and named:
            found.append(process)
    return found


def job_driver(name: str) -> psutil.Process:
    """The driver of submitted sweep ``name``, once its job has started it."""
    wait_for(lambda: bool(drivers(name)), 120, f"the driver of sweep {name}")
    return drivers(name)[0]


def wait_for_writers_to_exit(storage: Path, timeout: float = 120) -> None:
    """Wait until no process writes any trial store of ``storage``: each store's writer lock is
    free (the kernel releases it when its holder, a worker that outlived a killed driver, exits)."""
    for number in CheckpointStore.trials(str(storage)):
        with FileLock(CheckpointStore.of_trial(str(storage), number).writer_lock, timeout=timeout):
            pass


def kill_group(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def mlflow_runs(workspace: Path, experiment: str, tracking_uri: str | None = None) -> list:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri or f"sqlite:///{workspace / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment}"
    return client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=10_000)


def metric_steps(run_id: str, key: str, workspace: Path, tracking_uri: str | None = None) -> list[int]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri or f"sqlite:///{workspace / 'mlflow.db'}")
    return [m.step for m in client.get_metric_history(run_id, key)]


def optuna_trials(workspace: Path, name: str, storage: str | None = None) -> list:
    import optuna

    study = optuna.load_study(study_name=name, storage=storage or f"sqlite:///{workspace / 'optuna.db'}")
    return study.get_trials(deepcopy=False)


def tune_results(workspace: Path, name: str) -> dict[str, list[list[int]]]:
    """Epochs each trial reported to Tune, per Tune session, in order: {"trial-0001": [[1, 2], [3]]}."""
    sessions = sorted((workspace / "sweeps" / name / "tune").glob("session-*"))
    out: dict[str, list[list[int]]] = {}
    for session in sessions:
        for trial_dir in sorted(session.glob("trial-*")):
            lines = (trial_dir / "result.json").read_text().splitlines() if (trial_dir / "result.json").exists() else []
            out.setdefault(trial_dir.name, []).append([int(json.loads(line)["epoch"]) for line in lines])
    return out


def tune_trials(workspace: Path, name: str) -> dict[int, Any]:
    """What Tune ran each trial with, from the config it saved (``params.pkl``) in the trial's
    folder of its last session: {number: the trial's TrialSpec (params, config)}."""
    import pickle

    out = {}
    for path in sorted((workspace / "sweeps" / name / "tune").glob("session-*/trial-*/params.pkl")):
        spec = pickle.loads(path.read_bytes())["trial"]
        out[spec.number] = spec
    return out


# What the tests' nodes need from this environment, passed by name (`cluster up --pass-env`) as an
# operator would: the S3 server's address and keys (conftest's `s3`), and the Hugging Face Hub
# offline on the shared cache (the driver's data preparation reads the tokenizer there).
NODE_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "HF_HUB_OFFLINE",
    "HF_HUB_CACHE",
)


def local_cluster(
    root: Path,
    workers: int = 2,
    cpus_per_worker: int = 1,
    gpus_per_worker: int | None = None,
    pass_env: tuple[str, ...] = (),
) -> Iterator[dict[str, Any]]:
    """`seqae cluster up` in ``root`` (a head and ``workers`` worker nodes, PostgreSQL, MLflow),
    yielded as {root, state, env, up: the arguments of `up` after the verb}; after the caller is
    done, `down`, and a check that no process or listening port of it is left. ``gpus_per_worker``:
    each worker's GPUs (`ray start --num-gpus`), logical ones on a machine without GPUs. The nodes
    get the NODE_ENV names this environment sets and ``pass_env``."""
    # one cluster at a time on the loopback addresses, whichever test process (pytest-xdist) asks:
    # the lock sits in the folder every process's temporary folders are made in
    with FileLock(root.parent.parent / "local-cluster.lock"):
        stop_local_ray()
        gpus = [] if gpus_per_worker is None else ["--gpus-per-worker", str(gpus_per_worker)]
        passed = [n for n in NODE_ENV if n in os.environ and n not in pass_env] + list(pass_env)
        args = [
            "--dir",
            str(root),
            "--workers",
            str(workers),
            "--cpus-per-worker",
            str(cpus_per_worker),
            *gpus,
            *[a for name in passed for a in ("--pass-env", name)],
        ]
        yield from _local_cluster(root, args)


def _local_cluster(root: Path, args: list[str]) -> Iterator[dict[str, Any]]:
    from cluster import local

    up = seqae("cluster", "up", *args, timeout=300)
    try:  # a failed `up` may have started some of it
        assert up.returncode == 0, up.stdout + up.stderr
        state = local.read_state(root)
        with pytest.MonkeyPatch.context() as mp:  # the MLflow user, as a sourced env.sh gives it
            for key, value in local.mlflow_credentials(state).items():
                mp.setenv(key, value)
            yield {"root": root, "state": state, "env": local.environment(state), "up": args}
    finally:
        down = seqae("cluster", "down", "--dir", str(root), timeout=120)
        assert down.returncode == 0, down.stderr
        state = local.read_state(root)
        assert local.ray_processes(state.ray_temp_dir, state.ray_sessions) == []
        ports = {
            state.gcs_port,
            state.dashboard_port,
            state.mlflow.port,
            state.postgres.port,
            *range(state.node_ports, state.node_ports + local.NODE_PORTS * (state.workers + 1)),
        }
        import psutil

        listening = [c for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.laddr.port in ports]
        assert listening == [], listening  # nothing of the cluster's is left listening, whatever Ray started


def start_ui(workspace, log):
    """`seqae ui` on two free ports, once it says both serve: (process, mlflow_port, optuna_port)."""
    mlflow_port, optuna_port = free_port(), free_port()
    ui = start(
        "ui",
        "--workspace",
        str(workspace),
        "--mlflow-port",
        str(mlflow_port),
        "--optuna-port",
        str(optuna_port),
        log=log,
    )
    try:
        wait_for(lambda: "Ctrl-C stops both" in log.read_text(), 120, "seqae ui")
    except BaseException:
        kill_group(ui)
        raise
    return ui, mlflow_port, optuna_port


def stop_ui(ui, signum, log, ports) -> None:
    """Send ``signum`` to `seqae ui` alone; it exits cleanly and neither port answers any more."""
    ui.send_signal(signum)
    try:
        assert ui.wait(timeout=60) == 0
    finally:
        kill_group(ui)
    assert "stopped the MLflow UI and optuna-dashboard" in log.read_text()
    for port in ports:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


@contextlib.contextmanager
def forwarded(port: int, listen: str = "127.0.0.1") -> Iterator[int]:
    """A TCP forward from a free port on ``listen`` to the server's ``port``, as an SSH tunnel
    (`ssh -L`) or `kubectl port-forward` gives a laptop: bytes passed on unchanged, the Host header
    the client's own. Yields the forward's port."""
    listener = socket.create_server((listen, 0))

    def pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed
            while True:
                client, _ = listener.accept()
                server = socket.create_connection(("127.0.0.1", port))
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
