"""Starting and stopping the local services seqae runs for a cluster: detached processes with
their own log files, free loopback ports, and waiting until a service answers."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_block(size: int, host: str = "127.0.0.1", start: int = 20000, stop: int = 60000) -> int:
    """The first port of ``size`` consecutive free ports."""
    for base in range(start, stop - size, size):
        if all(_free(host, base + i) for i in range(size)):
            return base
    raise RuntimeError(f"no {size} consecutive free ports between {start} and {stop}")


def _free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def port_in_use(host: str, port: int) -> bool:
    """Whether a server started on ``host:port`` now would find it taken, as one that sets
    SO_REUSEADDR (MLflow's, optuna-dashboard's) does: a listener there, not a closed connection
    waiting out its TIME_WAIT. An address that cannot be bound for another reason is not "in use"."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
        return False


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None, user: str | None = None) -> int:
    """Start ``argv`` in a new session (so it and its children stop together); returns its pid."""
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    with open(log, "ab") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    return process.pid


def stop_group(pid: int, grace: float = 10.0) -> None:
    """SIGTERM the process group of ``pid``, then SIGKILL what is left after ``grace`` seconds."""
    stop_groups([pid], grace)


def stop_groups(pids: list[int], grace: float = 10.0) -> None:
    """SIGTERM the process groups of ``pids`` together, then SIGKILL what is left of them after
    ``grace`` seconds: their graces run at once, not one after another."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and any(alive_group(pid) for pid in pids):
        for pid in pids:  # a leader that is our child and has exited stays a zombie, "alive", until reaped
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def alive_group(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def wait_until(check: Callable[[], bool], timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.3)
    tail = ""
    if log is not None and log.exists():
        tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise RuntimeError(f"{what} did not come up within {timeout:.0f} s{tail}")


def http_ok(url: str, headers: dict[str, str] | None = None) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False
