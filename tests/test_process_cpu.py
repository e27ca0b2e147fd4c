"""`seqae bench processes` (benchmarks/process_cpu.py): a command's CPU-seconds counted by kind of
process, on a command whose CPU use is known."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

import psutil
import pytest

from benchmarks.process_cpu import Seen, category, run, sample, seqae_verb
from seqae.cli.main import main
from tests.refusal import assert_refused

# CPU time, not wall time: the loop spends 1.5 CPU-seconds on any machine, however loaded. Then
# the command idles for 3 s: the CPU that goes unseen is what a process spends after the sampler's
# last look at it, so all of it is seen unless a loaded machine holds the sampler off for 30 of its
# 0.1 s intervals. (Busy to its end, the command needed 1.4 of 1.5 CPU-seconds seen: one interval's
# margin, which a sampler run late on a loaded machine can overrun.)
BUSY = "import time\nwhile time.process_time() < 1.5:\n    pass\ntime.sleep(3)"


def test_a_commands_processes_are_counted_with_all_their_cpu():
    rows = {row["category"]: row for row in run(f"{sys.executable} -c {shlex.quote(BUSY)}", interval=0.1)}
    assert rows["other"]["cpu_seconds"] >= 1.5 and rows["other"]["processes"] >= 1, rows
    assert rows["all sampled processes"]["cpu_seconds"] >= rows["other"]["cpu_seconds"], rows
    assert rows["the machine's busy CPU-seconds (/proc/stat)"]["cpu_seconds"] >= 1.5, rows
    assert rows["the command"]["exit_code"] == 0, rows
    assert run("exit 3", interval=0.1)[-1] == {
        "category": "the command",
        "exit_code": 3,
        "wall_seconds": pytest.approx(0, abs=60),
    }


def test_a_process_last_seen_exited_counts_as_the_command_it_ran():
    """An exited process its parent has not reaped yet (a zombie) keeps its CPU times but no command
    line: counted as last seen, it was a kernel thread (1 run in 8 of the test above, beside a load)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        seen: dict[tuple[int, float], Seen] = {}
        deadline = time.time() + 60
        while not any(pid == child.pid and s.cmdline for (pid, _), s in seen.items()):  # seen running
            assert time.time() < deadline, "the child never showed its command line"
            sample(seen, psutil.Process(child.pid).create_time() - 1, os.getpid())
        child.stdin.close()  # it exits; unreaped until child.wait() below
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.time() < deadline, "the child never exited"
            time.sleep(0.01)
        sample(seen, psutil.Process(child.pid).create_time() - 1, os.getpid())
        (last,) = [s for (pid, _), s in seen.items() if pid == child.pid]
        assert "sys.stdin.read()" in last.cmdline and category(last) == "other", last
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    "name, cmdline, expected",
    [
        ("ray::ImplicitFunc.train", "ray::ImplicitFunc.train", "trials (Ray workers running a trial)"),
        ("ray::IDLE", "ray::IDLE", "Ray workers never given a trial"),
        (
            "python",
            "/venv/bin/python /venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py"
            " --node-ip-address=127.0.0.1",
            "Ray workers never given a trial",
        ),
        (
            "raylet",
            "/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=x",
            "Ray services (GCS, raylets, agents, monitors)",
        ),
        ("ray::DashboardAgent", "ray::DashboardAgent", "Ray services (GCS, raylets, agents, monitors)"),
        (
            "python",
            "/venv/bin/python -m seqae sweep resume steer --workspace ws",
            "seqae drivers (sweep run, resume, extend, fork)",
        ),
        (
            "seqae",
            "/venv/bin/python /venv/bin/seqae sweep run quickstart.yaml",
            "seqae drivers (sweep run, resume, extend, fork)",
        ),
        (
            "python",
            "/venv/bin/python -m seqae sweep status steer --json",
            "other seqae commands (status, logs, ui, cluster, ...)",
        ),
        ("python", "/venv/bin/python -c from xdist.remote import main", "pytest and its workers (in-process tests)"),
        ("postgres", "postgres: checkpointer", "PostgreSQL"),
        ("python", "/venv/bin/python /venv/bin/mlflow server --port 5000", "MLflow and optuna-dashboard servers"),
        (
            "ray-dashboard-J",
            "ray-dashboard-JobHead-0 (/venv/bin/python -B -c from multiprocessing.forkserver import main)",
            "Ray services (GCS, raylets, agents, monitors)",
        ),
        (
            "ray",
            "/venv/bin/python /venv/bin/ray start --address=127.0.0.2:6379",
            "Ray services (GCS, raylets, agents, monitors)",
        ),
        (
            "python",
            "/venv/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))",
            "pytest and its workers (in-process tests)",
        ),
        ("kworker/1:1H-kblockd", "", "kernel threads"),
        ("sleep", "sleep 1", "other"),
    ],
)
def test_each_process_counts_in_its_kind(name, cmdline, expected):
    assert category(Seen(1.0, name, cmdline)) == expected


def test_a_seqae_command_line_is_read_for_its_verb():
    assert seqae_verb("/venv/bin/python -m seqae sweep run x.yaml") == "sweep run"
    assert seqae_verb("/venv/bin/seqae ui --workspace ws") == "ui --workspace"
    assert seqae_verb("/venv/bin/python -m pytest") is None
    assert seqae_verb("/venv/bin/python /venv/bin/mypy seqae_core sweeps seqae") is None  # a folder, not the command


def test_the_suite_without_a_command_is_refused_in_one_line(capsys, tmp_path):
    code = main(["bench", "processes", "--out", str(tmp_path / "bench.json")])
    assert_refused(
        code, capsys.readouterr().err, "bench processes needs --command CMD", created=(tmp_path / "bench.json",)
    )
