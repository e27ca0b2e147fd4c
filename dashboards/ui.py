"""``seqae ui``: the MLflow UI on a workspace's tracking store and optuna-dashboard on its study
storage, both on 127.0.0.1 by default, stopped together on Ctrl-C, SIGTERM (a process manager)
or SIGHUP (a closed terminal). It prints the page of each sweep's runs (:func:`runs_url`).

A tracking server (a cluster's, ``http://...``) serves its own UI, so only optuna-dashboard starts
and the server's address is printed. Where the server requires users (``seqae cluster up``'s
does), the browser asks for a user and password: no proxy hands the user's credentials to
whoever else reaches a port on this machine.

Neither optuna-dashboard nor the MLflow UI started on a workspace's own store has a login: they
serve on loopback only, reached from elsewhere through an SSH tunnel or a port-forward, unless the
user says an authenticating proxy fronts them (:func:`check_host`)."""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
import time
from pathlib import Path

import optuna
from mlflow.tracking import MlflowClient

from cluster import mlflow_server
from cluster.procs import free_port, http_ok, port_in_use, spawn, stop_groups, wait_until
from seqae_core import names as N
from seqae_errors import ConfigError

# The UIs hold nothing that a kill loses (SQLite keeps its own transactions whole): a server still
# up this long after SIGTERM is killed, so that Ctrl-C ends `seqae ui` within about 4 s.
STOP_GRACE = 4.0


def serve(
    mlflow_uri: str,
    artifacts: str,
    optuna_storage: str,
    host: str,
    mlflow_port: int,
    optuna_port: int,
    logs: Path,
    until: float | None = None,
) -> None:
    """Start both UIs, print their URLs, and stop both on Ctrl-C, SIGTERM or SIGHUP (or after
    ``until`` seconds)."""
    server = mlflow_uri.startswith(("http://", "https://"))
    check_ports(host, {**({} if server else {"--mlflow-port": mlflow_port}), "--optuna-port": optuna_port})
    optuna.storages.RDBStorage(optuna_storage)  # optuna-dashboard refuses a file without tables
    # The servers run in process groups of their own (so a Ctrl-C reaches them only through us);
    # every way of being told to stop must therefore come through the same cleanup.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    logs.mkdir(parents=True, exist_ok=True)
    pids = []
    try:
        if not server:
            pids.append(mlflow_server.start(mlflow_uri, artifacts, mlflow_port, logs / "mlflow-ui.log", host=host))
        dashboard = str(Path(sys.executable).parent / "optuna-dashboard")
        pids.append(
            spawn(
                [dashboard, optuna_storage, "--host", host, "--port", str(optuna_port)], logs / "optuna-dashboard.log"
            )
        )
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{optuna_port}/api/studies"),
            60,
            "optuna-dashboard",
            logs / "optuna-dashboard.log",
        )
        base = mlflow_uri if server else f"http://{host}:{mlflow_port}"
        note = (
            (
                "  (the tracking server's own; if it asks, log in as MLFLOW_TRACKING_USERNAME with "
                "MLFLOW_TRACKING_PASSWORD)"
            )
            if server
            else ""
        )
        print(f"MLflow UI         {base}{note}", flush=True)
        for name, experiment_id in sweeps(mlflow_uri):
            print(f"  sweep {name}: {runs_url(base, experiment_id)}", flush=True)
        print(f"optuna-dashboard  http://{host}:{optuna_port}", flush=True)
        if not loopback(host):
            print(
                f"{'optuna-dashboard has' if server else 'optuna-dashboard and the MLflow UI have'} no login of "
                f"their own: only the authenticating proxy in front of {host} keeps others out",
                flush=True,
            )
        print("Ctrl-C stops optuna-dashboard." if server else "Ctrl-C stops both.", flush=True)
        deadline = None if until is None else time.time() + until
        while deadline is None or time.time() < deadline:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop_groups(pids, STOP_GRACE)
        print("stopped optuna-dashboard" if server else "stopped the MLflow UI and optuna-dashboard", flush=True)


def check_host(host: str, behind_auth_proxy: bool) -> None:
    """Refuse to serve on an address other than loopback, unless an authenticating proxy fronts it:
    whoever reaches optuna-dashboard can change or delete any study."""
    if behind_auth_proxy or loopback(host):
        return
    raise ConfigError(
        f"--host {host}: optuna-dashboard has no login (whoever reaches it can delete a study), nor "
        "has the MLflow UI `seqae ui` starts on a workspace's own store; serve on 127.0.0.1 and reach "
        "it through an SSH tunnel (ssh -L 8080:127.0.0.1:8080 HOST) or kubectl port-forward, or put an "
        "authenticating proxy in front and pass --behind-auth-proxy"
    )


def loopback(host: str) -> bool:
    """Whether ``host`` (an address, or a name: every address it resolves to) is this machine's loopback."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = {str(info[4][0]).split("%")[0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return all(ipaddress.ip_address(a).is_loopback for a in found)


def check_ports(host: str, ports: dict[str, int]) -> None:
    """Refuse, naming the option, a port something already listens on: the server started there
    would exit, and the wait for it to answer would run out only after minutes, or be answered
    by the other program."""
    for option, port in ports.items():
        if port_in_use(host, port):
            raise ConfigError(
                f"{option}={port}: {host}:{port} is already in use (another `seqae ui`, or another "
                f"program); pass another port ({option} {free_port(host)} is free now), or stop "
                "what listens there"
            )


def runs_url(base: str, experiment_id: str) -> str:
    """The MLflow UI's page of an experiment's runs. MLflow 3.17's UI opens an experiment on the
    page of the workflow type a browser last chose (GenAI by default: traces and token usage), not
    by the experiment's kind tag; ``workflowType=machine_learning`` opens it on model training."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def sweeps(mlflow_uri: str) -> list[tuple[str, str]]:
    """(sweep name, experiment id) of each sweep tracked at ``mlflow_uri``."""
    experiments = MlflowClient(mlflow_uri).search_experiments(filter_string="tags.`seqae.sweep` ILIKE '%'")
    return sorted((e.tags[N.SWEEP], e.experiment_id) for e in experiments)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)
