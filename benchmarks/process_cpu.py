"""``seqae bench processes --command CMD``: where a command's CPU-seconds go, by kind of process.

Made for `.ci/run` (``seqae bench processes --command .ci/run``): its two cores are busy nearly
all the time, so only doing less work shortens it, and this says which work. Every process that
starts while CMD runs is sampled every ``interval`` seconds (psutil: its user and system CPU, its
name and command line) and counted, as last seen (by the command line it was last seen with), in
the first category of :data:`CATEGORIES` whose rule matches it. Ray's daemons count too, though
they leave the command's process tree.

A process's CPU after its last sample is not seen (at most one interval of it), nor is a process
that lived less than one interval: the table's last rows set the sampled total beside the
machine's busy CPU-seconds over the same time (``/proc/stat``), which also hold whatever else
ran on the machine. Time it on an otherwise idle machine."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from benchmarks.rows import Row

RAY_SERVICE_ACTORS = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
DRIVER_VERBS = ("sweep run", "sweep resume", "sweep extend", "sweep fork")


@dataclass(frozen=True)
class Seen:
    """A process as last sampled."""

    cpu: float  # user + system seconds
    name: str
    cmdline: str


def seqae_verb(cmdline: str) -> str | None:
    """The first two words after ``seqae`` (the console script) or ``-m seqae``; None if the
    command line is not a seqae command."""
    words = cmdline.split()
    for i, word in enumerate(words[:3]):  # the interpreter, then `-m seqae` or the script
        if (word == "seqae" and i > 0 and words[i - 1] == "-m") or os.path.basename(word) == "seqae":
            return " ".join(words[i + 1 : i + 3])
    return None


def _seqae_is(verbs: tuple[str, ...] | None) -> Callable[[Seen], bool]:
    def rule(p: Seen) -> bool:
        verb = seqae_verb(p.cmdline)
        return verb is not None and (verbs is None or verb in verbs)

    return rule


def _ray_service(p: Seen) -> bool:
    """Ray's daemons, its dashboard's modules (``ray-dashboard-JobHead-0``, ...) and ``ray start``."""
    return (
        p.name in ("raylet", "gcs_server", "ray")
        or p.name in RAY_SERVICE_ACTORS
        or p.name.startswith("ray-dashboard")
        or "/ray/" in p.cmdline
    )


def _has(*words: str) -> Callable[[Seen], bool]:
    return lambda p: any(w in p.name or w in p.cmdline for w in words)


# In order: a process counts in the first whose rule matches it.
CATEGORIES: list[tuple[str, Callable[[Seen], bool]]] = [
    ("trials (Ray workers running a trial)", lambda p: p.name.startswith("ray::") and p.name not in RAY_SERVICE_ACTORS),
    ("Ray workers never given a trial", lambda p: p.name == "ray::IDLE" or "default_worker.py" in p.cmdline),
    ("Ray services (GCS, raylets, agents, monitors)", _ray_service),
    ("seqae drivers (sweep run, resume, extend, fork)", _seqae_is(DRIVER_VERBS)),
    ("other seqae commands (status, logs, ui, cluster, ...)", _seqae_is(None)),
    # pytest-xdist's workers start through execnet's bootstrap, which names neither
    (
        "pytest and its workers (in-process tests)",
        _has("pytest", "xdist", "execnet", "exec(eval(sys.stdin.readline()))"),
    ),
    ("PostgreSQL", _has("postgres")),
    (
        "MLflow and optuna-dashboard servers",
        _has("mlflow", "gunicorn", "uvicorn", "optuna-dashboard", "optuna_dashboard"),
    ),
    ("Chromium", _has("chrom")),
    ("pip", _has("pip")),
    ("mypy", _has("mypy")),
    ("mkdocs", _has("mkdocs")),
    ("kernel threads", lambda p: not p.cmdline),
]
OTHER = "other"


def category(p: Seen) -> str:
    return next((name for name, rule in CATEGORIES if rule(p)), OTHER)


def sample(seen: dict[tuple[int, float], Seen], since: float, me: int) -> None:
    """Every process started at or after ``since`` (but this one), into ``seen``."""
    for process in psutil.process_iter(["pid", "create_time", "name", "cmdline", "cpu_times"], ad_value=None):
        info = process.info
        if info["pid"] == me or info["create_time"] is None or info["create_time"] < since or info["cpu_times"] is None:
            continue
        times, key = info["cpu_times"], (info["pid"], info["create_time"])
        name, cmdline = info["name"] or "", " ".join(info["cmdline"] or ())
        before = seen.get(key)
        if not cmdline and before is not None:  # a zombie (exited, not yet reaped) has lost its command
            name, cmdline = before.name, before.cmdline  # line, and would count as a kernel thread
        seen[key] = Seen(times.user + times.system, name, cmdline)


def busy_seconds(times: Any) -> float:
    """The machine's busy CPU-seconds in ``psutil.cpu_times()``: all but idle and I/O wait."""
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def run(command: str, interval: float = 1.0) -> list[Row]:
    """Run ``command`` (a shell command line) to its end, sampling; a row per category, then the
    totals, the command's exit code and wall seconds."""
    machine_before, mine_before = psutil.cpu_times(), psutil.Process().cpu_times()
    began = time.time()
    seen: dict[tuple[int, float], Seen] = {}
    command_process = subprocess.Popen(command, shell=True)
    while True:
        sample(seen, began - 1.0, os.getpid())  # create_time is rounded: a second's margin
        try:
            code = command_process.wait(timeout=interval)
            break
        except subprocess.TimeoutExpired:
            continue
    sample(seen, began - 1.0, os.getpid())
    wall = time.time() - began
    machine = busy_seconds(psutil.cpu_times()) - busy_seconds(machine_before)
    mine = sum(psutil.Process().cpu_times()[:2]) - sum(mine_before[:2])
    cpu: dict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for process in seen.values():
        kind = category(process)
        cpu[kind] += process.cpu
        count[kind] += 1
    sampled = sum(cpu.values())
    rows: list[Row] = [
        {
            "category": name,
            "cpu_seconds": round(seconds, 1),
            "share": f"{100 * seconds / max(sampled, 1e-9):.1f}%",
            "processes": count[name],
        }
        for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])
    ]
    return rows + [
        {
            "category": "all sampled processes",
            "cpu_seconds": round(sampled, 1),
            "share": "100.0%",
            "processes": len(seen),
        },
        {"category": "this sampler", "cpu_seconds": round(mine, 1)},
        {
            "category": "the machine's busy CPU-seconds (/proc/stat)",
            "cpu_seconds": round(machine, 1),
            "share": f"{100 * machine / (wall * (psutil.cpu_count() or 1)):.0f}% of {psutil.cpu_count()} cores",
        },
        {"category": "the command", "exit_code": code, "wall_seconds": round(wall, 1)},
    ]
