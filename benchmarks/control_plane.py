"""What the control plane costs as a sweep grows: finished sweeps of N trials, built straight into
the real stores (no training, no Ray), and the commands a user runs on them, each in a fresh
process, timed with its peak memory.

A sweep of N trials is built with N - 1 of them finished (the driver's start below asks for the
Nth: a sweep holds 10,000 at most), the way `seqae sweep run` leaves the quickstart's: its
``sweep.json`` (seqae's own spec and workspace code); an Optuna study (SQLite in the workspace,
or PostgreSQL on loopback through :mod:`cluster.postgres`) whose trials carry the parameters,
values, intermediate values and attributes a driver writes, about 60% complete, 35% pruned and
5% failed; an MLflow experiment (SQLite) with the sweep's run and a child run per trial (every
config key as a parameter, three epochs of metrics, a short loss curve, the tags a driver sets,
``samples.json`` as its best-model artifact); and each trial's checkpoint records (two epoch
records and a best record, with tiny state). The study and the records are written in a second
process beside MLflow's, and SQLite without waiting for the disk: 10,000 trials take a few
minutes on two cores.

Timed, each as ``python -m seqae ...`` in a new process: wall seconds from start to exit, its
CPU seconds (user and system, from the child's own ``wait4`` rusage: what a busy machine inflates
least) and its peak resident memory (the kernel's VmHWM, read as it exits: ``LAUNCH``):

    status          seqae sweep status NAME
    status --json   seqae sweep status NAME --json
    sweep list      seqae sweep list
    export          seqae sweep export NAME --format csv
    report          seqae report NAME
    driver start    a driver's start after `seqae sweep extend NAME --trials 1`, up to its first new
                    trial (``benchmarks/driver_start.py``, run the same way in a new process).
                    ``start_s`` is that path alone, timed inside the process; ``wall_s`` adds the
                    interpreter's start and imports.

With ``--before DIR`` (a checkout of seqae from before the control plane's fixes), each command is
timed again on the same sweeps with that code first on the path: the table's ``code`` column says
which (``after`` is this checkout).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypedDict

import optuna
from mlflow.entities import Metric, Param
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from sqlalchemy import event
from sqlalchemy.engine import Engine

from cluster import postgres
from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.borders import OptunaAttrs
from seqae_core.checkpoint import CheckpointStore
from seqae_core.config import Flat
from seqae_core.records import METRICS, MODEL, SAMPLES_JSON, SAMPLES_TXT
from sweeps.running.lifecycle import extend
from sweeps.spec import sweep as spec_lib
from sweeps.spec.sections import Distribution
from sweeps.stores.proposals import optuna_distribution
from sweeps.stores.search import directions_of, storage
from sweeps.stores.workspace import Backends, SessionRecord, SweepState, Workspace

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "sweeps" / "studies" / "quickstart.yaml"
DRIVER_START = Path(__file__).resolve().parent / "driver_start.py"
EPOCHS = 3
LOSS_POINTS = 8  # points of the training-loss curve per epoch
NAME = "cp"
# A trial to build: its number, starting point, params, fate and history (its epoch records).
Plan = tuple[int, str | None, Flat, str, list[dict[str, Any]]]


class _Timed(TypedDict):
    command: str
    wall_s: float
    cpu_s: float
    peak_mib: int


class Timing(_Timed, total=False):
    """A command's row of :func:`measure`: its wall and CPU seconds and peak memory."""

    start_s: float  # the driver's start alone, timed inside its process


class Measured(Timing):
    """A row of ``seqae bench control-plane``: a command timed on a sweep of ``trials`` trials."""

    trials: int
    optuna: str
    code: str
    built_s: int


class Growth(TypedDict):
    """A growth row of ``seqae bench control-plane``: a command's figures at a size over the size before."""

    trials: str
    optuna: str
    code: str
    command: str
    wall_s: str
    cpu_s: str
    peak_mib: str


SAMPLES = [{"original": ["the", "cat", "sat"], "reconstruction": ["the", "dog", "sat"]}] * 2  # a best record's


def _history(rng: random.Random, epochs: int, test: bool) -> list[dict[str, Any]]:
    """A trial's epoch records, as training reports them."""
    acc, records = rng.uniform(0.3, 0.6), []
    for epoch in range(1, epochs + 1):
        acc = min(0.99, acc + rng.uniform(0.0, 0.1))
        record = {
            M.EPOCH: epoch,
            M.TRAIN_LOSS: 3 - 2 * acc,
            M.VAL_LOSS: 3.1 - 2 * acc,
            M.VAL_TOKEN_ACCURACY: acc,
            M.VAL_SEQUENCE_ACCURACY: acc / 4,
            M.LEARNING_RATE: 1e-3,
            M.TOKENS_PER_S: 9000.0,
            M.EPOCH_SECONDS: rng.uniform(20, 40),
            M.LATENT_FRACTION: 0.5,
            M.BEST_EPOCH: epoch,
            M.BEST_VAL_TOKEN_ACCURACY: acc,
            M.DATA_SECONDS: 0.2,
            M.GLOBAL_STEP: 40 * epoch,
            M.TRAIN_LOSS_STEPS: [
                [40 * (epoch - 1) + 5 * k, 3 - 2 * acc + 0.1 / (k + 1)] for k in range(1, LOSS_POINTS + 1)
            ],
            "system/cpu_percent": 95.0,
            "system/memory_gib": 1.2,
        }
        if test:
            record |= {M.TEST_LOSS: 3.2 - 2 * acc, M.TEST_TOKEN_ACCURACY: acc - 0.01, M.TEST_SEQUENCE_ACCURACY: acc / 5}
        records.append(record)
    return records


@contextlib.contextmanager
def _unsynced() -> Iterator[None]:
    """SQLite databases opened meanwhile are written without waiting for the disk (no fsync, the
    rollback journal in memory): otherwise each transaction, one per Optuna trial and several per
    MLflow run, waits for the disk. Neither setting outlives its connection: the files are
    ordinary databases."""

    def connected(connection: Any, _record: Any) -> None:
        if isinstance(connection, sqlite3.Connection):
            connection.execute("PRAGMA synchronous = OFF")
            connection.execute("PRAGMA journal_mode = MEMORY")

    event.listen(Engine, "connect", connected)
    try:
        yield
    finally:
        event.remove(Engine, "connect", connected)


def _levels(distribution: Distribution) -> list[Any]:
    """A width's values: its choices, or an int's values on its step (as the quickstart declares them)."""
    if distribution.choices:
        return list(distribution.choices)
    assert distribution.low is not None and distribution.high is not None
    return list(range(int(distribution.low), int(distribution.high) + 1, distribution.step or 1))


def build(root: Path, trials: int, optuna_url: str | None = None, seed: int = 0) -> Workspace:
    """A finished quickstart sweep of ``trials`` trials named ``cp`` in a new workspace at ``root``."""
    rng = random.Random(seed)
    workspace = Workspace(root)
    root.mkdir(parents=True, exist_ok=True)
    spec = spec_lib.load(STUDY, [f"trials.total={trials}"])
    backends = workspace.default_backends(NAME)
    if optuna_url:
        backends = Backends(backends.mlflow_tracking_uri, optuna_url, backends.storage)
    state = SweepState(
        name=NAME,
        spec=spec,
        fingerprint=spec.fingerprint(),
        file=str(STUDY),
        sets=[],
        planned_trials=spec.planned_trials(),
        backends=backends,
        study_name=NAME,
    )
    lr, d_model, d_attn = (spec.search[key] for key in ("train.lr", "model.d_model", "model.d_attn"))
    assert lr.low is not None and lr.high is not None  # a loguniform has bounds
    plans: list[Plan] = []
    for number in range(trials):
        start = "paper_lr" if number == 0 else None
        params = (
            dict(spec.start_params("paper_lr"))
            if start
            else {  # inside the quickstart's own space
                "train.lr": rng.uniform(lr.low, lr.high),
                "model.d_model": rng.choice(_levels(d_model)),
                "model.d_attn": rng.choice(_levels(d_attn)),
            }
        )
        fate = "COMPLETE" if start else rng.choices(["COMPLETE", "PRUNED", "FAIL"], [60, 35, 5])[0]
        epochs = {"COMPLETE": EPOCHS, "PRUNED": rng.choice([1, 2]), "FAIL": 0}[fate]
        plans.append((number, start, params, fate, _history(rng, epochs, test=True)))

    # The study and the checkpoint records are written by a second process while this one fills
    # MLflow: each takes about half of the time. Spawned, not forked, as this process may run
    # threads (MLflow's telemetry) that a fork would copy in the middle of holding a lock; so a
    # script that calls build needs the usual ``if __name__ == "__main__"`` guard.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as other:
        study = other.submit(_study_and_records, spec, state.fingerprint, backends, plans)
        experiment_id, parent_id = _tracking(workspace, spec, state.fingerprint, backends, plans)
        study.result()
    counts: dict[str, int] = {}
    for _, _, _, fate, _ in plans:
        counts[fate] = counts.get(fate, 0) + 1
    state.mlflow_experiment_id, state.mlflow_parent_run_id = experiment_id, parent_id
    state.sessions = [
        SessionRecord(
            started=time.time(),
            ended=time.time(),
            outcome="complete",
            trials=counts,
            interrupted=False,
            pid=0,
            host="bench",
            user=None,
        )
    ]
    workspace.write(state)
    return workspace


@_unsynced()
def _study_and_records(spec: spec_lib.SweepSpec, fingerprint: str, backends: Backends, plans: list[Plan]) -> None:
    """The sweep's Optuna study, and each trial's checkpoint records."""
    study = optuna.create_study(
        storage=storage(backends.optuna_storage), study_name=NAME, directions=directions_of(spec)
    )
    study.set_user_attr(N.FINGERPRINT, fingerprint)
    study.set_metric_names([o.metric for o in spec.objectives])
    dists = {k: optuna_distribution(spec.search[k]) for k in spec.sampling_order()}
    frozen = []
    for number, start, params, fate, history in plans:
        attrs: OptunaAttrs = {
            N.PROPOSED_BY: "start" if start else "random start-up" if number < 3 else "tpe",
            N.TUNE_TRIAL_IDS: [f"{number:05d}abcd"],
        }
        if start:
            attrs[N.START] = start
        if history:
            attrs[N.TEST] = {k: history[-1][k] for k in M.TEST_METRICS}
        frozen.append(
            optuna.trial.create_trial(
                state=TrialState[fate],
                params=params,
                distributions=dists,
                values=[max(h[M.VAL_TOKEN_ACCURACY] for h in history)] if fate == "COMPLETE" else None,
                intermediate_values={h[M.EPOCH]: h[M.VAL_TOKEN_ACCURACY] for h in history},
                user_attrs=attrs,
                system_attrs={"fixed_params": params} if start else {},
            )
        )
    study.add_trials(frozen)

    for number, _, _, fate, history in plans:
        store = CheckpointStore.of_trial(backends.storage, number)
        for record in history[-store.keep :]:  # the records it keeps: it would prune older ones at once
            epoch = record[M.EPOCH]
            plain = [
                {k: v for k, v in h.items() if k != M.TRAIN_LOSS_STEPS} | {M.TRAIN_LOSS_STEPS: []}
                for h in history[:epoch]
            ]
            store.save_epoch(
                epoch,
                {"epoch": epoch},
                {"history": plain, "finished": fate == "COMPLETE" and epoch == len(history), "patience_spent": False},
            )
        if history:
            kept = max(history, key=lambda h: h[M.VAL_TOKEN_ACCURACY])
            store.save_best(
                kept[M.EPOCH],
                {MODEL: b"\0", SAMPLES_JSON: json.dumps(SAMPLES).encode(), SAMPLES_TXT: b"", METRICS: b"{}"},
                {"metrics": {}},
            )


@_unsynced()
def _tracking(
    workspace: Workspace, spec: spec_lib.SweepSpec, fingerprint: str, backends: Backends, plans: list[Plan]
) -> tuple[str, str]:
    """The sweep's MLflow experiment, its run and a child run per trial: the experiment's id and the run's."""
    client = MlflowClient(backends.mlflow_tracking_uri)
    experiment_id = client.create_experiment(
        NAME,
        artifact_location=(workspace.artifact_root / NAME).as_uri(),
        tags={N.FINGERPRINT: fingerprint, N.SWEEP: NAME},
    )
    parent = client.create_run(experiment_id, run_name=NAME, tags={N.SWEEP: NAME, N.ROLE: N.ROLE_SWEEP})
    source = {
        "mlflow.source.name": str(STUDY),
        "mlflow.source.type": "LOCAL",
        N.CODE: "0123456789ab",
        N.CODE_DIRTY: "false",
        "mlflow.source.git.commit": "0" * 40,
        **{f"{N.VERSION}{p}": "1.0" for p in ("torch", "ray", "optuna", "mlflow", "transformers")},
    }
    base = spec_lib.cell_configs(spec)[0].flat()
    with tempfile.TemporaryDirectory() as tmp:
        sample_file = Path(tmp) / SAMPLES_JSON
        sample_file.write_text(json.dumps(SAMPLES))
        for number, start, params, fate, history in plans:
            outcome = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}[fate]
            tags = {
                "mlflow.parentRunId": parent.info.run_id,
                N.SWEEP: NAME,
                N.TRIAL: str(number),
                N.OPTUNA_TRIAL: str(number),
                **source,
                N.TUNE_TRIAL_ID: f"{number:05d}abcd",
                N.NODE_IP: "127.0.0.1",
                N.NODE_ID: "f" * 56,
                N.HOSTNAME: "bench",
                N.OUTCOME: outcome,
                N.RESOURCE: "cpu",
                **({N.START: start} if start else {}),
            }
            if history:
                tags[N.ARTIFACTS_EPOCH] = str(max(history, key=lambda h: h[M.VAL_TOKEN_ACCURACY])[M.EPOCH])
            # What a driver writes over a trial's life, in as few calls as MLflow takes it (each is
            # a transaction or more): every tag as the run is created, then one batch (up to 1,000
            # entities); the artifact goes straight to the run's artifact store, which
            # MlflowClient.log_artifact would first read the run again to find.
            run = client.create_run(
                experiment_id, run_name=f"trial-{number:04d}" + (f"-{start}" if start else ""), tags=tags
            )
            if history:
                get_artifact_repository(run.info.artifact_uri).log_artifact(str(sample_file))
            logged = {**base, **params, "model.latent_len": 32, "model.latent_fraction": 0.5}
            now = int(time.time() * 1000)
            metrics = [Metric(M.TRAIN_LOSS_STEPS, v, now, int(s)) for r in history for s, v in r[M.TRAIN_LOSS_STEPS]]
            metrics += [
                Metric(k, float(v), now, r[M.EPOCH])
                for r in history
                for k, v in r.items()
                if k not in (M.EPOCH, M.TRAIN_LOSS_STEPS)
            ]
            metrics.append(Metric(M.RESOURCE_SECONDS, sum(h[M.EPOCH_SECONDS] for h in history), now, len(history)))
            client.log_batch(
                run.info.run_id,
                metrics=metrics,
                params=[Param(k, "null" if v is None else str(v)) for k, v in sorted(logged.items())],
            )
            client.set_terminated(run.info.run_id, "FAILED" if fate == "FAIL" else "FINISHED")
    client.set_tag(parent.info.run_id, N.ENDED, "complete")
    client.set_terminated(parent.info.run_id, "FINISHED")
    return experiment_id, parent.info.run_id


# Runs a module as ``python -m`` would (or a script, given its path), then writes the process's
# peak resident memory (VmHWM) to the file named first: the rusage of a child (``ru_maxrss``)
# counts the parent's memory copied at the fork it was started by, which exec does not reset.
LAUNCH = """import atexit, runpy, sys
out, target = sys.argv[1], sys.argv[2]
def peak():
    with open("/proc/self/status") as status, open(out, "w") as f:
        f.write(next(line for line in status if line.startswith("VmHWM:")).split()[1])
atexit.register(peak)
sys.argv = [target, *sys.argv[3:]]
if target.endswith(".py"):
    runpy.run_path(target, run_name="__main__")
else:
    runpy.run_module(target, run_name="__main__", alter_sys=True)
"""


def _timed(target: str, args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, float, str]:
    """Run ``python -m target args`` (or the script ``target``) in a new process: its wall
    seconds, its CPU seconds (user and system, from its rusage), its peak resident MiB (``LAUNCH``)
    and its stdout."""
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        tempfile.NamedTemporaryFile("r") as peak,
    ):
        start = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, peak.name, target, *args], stdout=out, stderr=err, env=env, cwd=cwd
        )
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        text = out.read()
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{target} {' '.join(args)} failed:\n{text[-2000:]}\n{err.read()[-3000:]}")
        kib = float(peak.read() or "nan")
    return wall, usage.ru_utime + usage.ru_stime, kib / 1024, text


def cli_module(code: Path) -> str:
    """The command line's module in checkout ``code``: ``seqae``, or ``seqae_cli`` in one from
    before the command line moved into the ``seqae`` package."""
    return "seqae" if (code / "seqae" / "__main__.py").is_file() else "seqae_cli"


def measure(workspace: Workspace, env: dict[str, str], freeze: bool, cli: str) -> list[Timing]:
    """Each command's wall seconds, CPU seconds and peak memory on the sweep ``cp`` of
    ``workspace``, with the seqae that ``env``'s path finds first (the processes run in the
    workspace, so that this checkout is not found first by being the working directory), its
    command line ``python -m cli``; ``freeze``: the driver's start freezes its imports, as that
    seqae's driver does."""
    ws = ["--workspace", str(workspace.root)]
    (workspace.root / "t.csv").unlink(missing_ok=True)  # an earlier measure's export: export never overwrites
    commands = {
        "status": ["sweep", "status", NAME, *ws],
        "status --json": ["sweep", "status", NAME, "--json", *ws],
        "sweep list": ["sweep", "list", *ws],
        "export": ["sweep", "export", NAME, "--format", "csv", "--out", str(workspace.root / "t.csv"), *ws],
        "report": ["report", NAME, *ws],
    }
    rows: list[Timing] = []
    for label, args in commands.items():
        wall, cpu, peak, _ = _timed(cli, args, env, workspace.root)
        rows.append({"command": label, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_mib": round(peak)})
    extend(workspace, NAME, 1)  # as `seqae sweep extend NAME --trials 1` does before its driver starts
    args = [str(workspace.root), NAME, *(["--freeze"] if freeze else [])]
    wall, cpu, peak, text = _timed(str(DRIVER_START), args, env, workspace.root)
    start = json.loads(text.strip().splitlines()[-1])["start_s"]
    rows.append(
        {
            "command": "driver start",
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "peak_mib": round(peak),
            "start_s": round(start, 2),
        }
    )
    return rows


def run(sizes: list[int], backends: list[str], before: Path | None = None) -> list[Measured | Growth]:
    """The table: a row per size, Optuna storage, code and command; then each command's growth
    from one size to the next (time and memory ratios). ``before``: a checkout of seqae from before
    the control plane's fixes, whose commands are timed on the same sweeps after this checkout's
    (code ``before``; this checkout's is ``after``)."""

    def path_env(code: Path) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}

    codes = {
        "after": (path_env(REPO), True, cli_module(REPO)),
        **({"before": (path_env(before), False, cli_module(before))} if before else {}),
    }
    rows: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="seqae-cp-") as tmp:
        pg = None
        if "postgresql" in backends:
            pg = postgres.create(Path(tmp) / "secrets", port=_free_port())
            postgres.start(pg, Path(tmp) / "postgres.log")
            os.environ["PGPASSFILE"] = pg.pgpass_of("optuna")
        try:
            for backend in backends:
                for size in sizes:
                    url = None
                    if backend == "postgresql":
                        assert pg is not None
                        database = f"optuna_{size}"
                        postgres.create_database(pg, database, "optuna")
                        url = pg.url(database, "optuna")
                    started = time.perf_counter()
                    # a trial short per code, for the one each code's driver start asks for: a sweep
                    # holds 10,000 at most
                    workspace = build(Path(tmp) / f"{backend}-{size}", size - len(codes), url)
                    built = time.perf_counter() - started
                    for code, (env, freeze, cli) in codes.items():
                        env = {**env, **({"PGPASSFILE": pg.pgpass_of("optuna")} if pg else {})}
                        for row in measure(workspace, env, freeze, cli):
                            rows.append(
                                {"trials": size, "optuna": backend, "code": code, **row, "built_s": round(built)}
                            )
                            # a 10,000-trial table takes most of an hour: each row shows as it is measured
                            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            if pg is not None:
                postgres.stop(pg)
    return [*rows, *growth(rows)]


def growth(rows: list[Measured]) -> list[Growth]:
    """Each command's time and memory at each size over the size before it (x10 trials: linear is 10)."""
    out: list[Growth] = []
    by_key = {(r["optuna"], r["code"], r["command"], r["trials"]): r for r in rows}
    for (backend, code, command, size), row in by_key.items():
        smaller = [s for (b, k, c, s) in by_key if (b, k, c) == (backend, code, command) and s < size]
        if smaller:
            before = by_key[(backend, code, command, max(smaller))]
            out.append(
                {
                    "trials": f"{max(smaller)}->{size}",
                    "optuna": backend,
                    "code": code,
                    "command": command,
                    "wall_s": f"x{row['wall_s'] / max(before['wall_s'], 1e-9):.2f}",
                    "cpu_s": f"x{row['cpu_s'] / max(before['cpu_s'], 1e-9):.2f}",
                    "peak_mib": f"x{row['peak_mib'] / max(before['peak_mib'], 1e-9):.2f}",
                }
            )
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
