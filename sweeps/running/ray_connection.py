"""The Ray cluster a driver runs on: joining it (or starting a local one), and what it can hold.

A trial that asks for more than the largest node has would wait forever, and SQLite backends
cannot serve trials on other nodes: both are refused here before anything is created."""

from __future__ import annotations

import logging
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

import ray

from seqae_errors import ConfigError
from sweeps.running import ray_private as RP
from sweeps.spec import sweep as spec_lib
from sweeps.stores.workspace import Backends


@dataclass(frozen=True)
class Cluster:
    """The Ray cluster a driver joined (:func:`join`): the CPUs and GPUs of its largest alive node,
    what one trial can get."""

    cpus: float
    gpus: float


def join(home: Path, backends: Backends) -> Cluster:
    """Connect to Ray (:func:`connect_ray`), refuse SQLite ``backends`` on a cluster of several
    nodes (:func:`check_cluster`), and read what one trial can get, from one read of Ray's nodes:
    once per driver process, which hands the :class:`Cluster` on rather than asking Ray again."""
    connect_ray(home)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    check_cluster(len(nodes), backends)
    resources = [n["Resources"] for n in nodes]
    return Cluster(max(r.get("CPU", 0.0) for r in resources), max(r.get("GPU", 0.0) for r in resources))


def check_cluster(nodes: int, backends: Backends) -> None:
    """Refuse SQLite backends when the Ray cluster has more than one node (``nodes`` alive)."""
    if nodes > 1 and backends.local:
        raise ConfigError(
            f"this Ray cluster has {nodes} nodes, but the sweep would keep MLflow or Optuna in SQLite files "
            "on the driver's disk: trials on other nodes could not be tracked, and SQLite locks under concurrent "
            "writers. Start an MLflow server and a PostgreSQL database (`seqae cluster up` does both) and set "
            "SEQAE_MLFLOW_TRACKING_URI and SEQAE_OPTUNA_STORAGE."
        )


def check_resources(spec: spec_lib.SweepSpec, cpus: float, gpus: float) -> None:
    """Refuse a trial that asks for more than the cluster (or this machine) has: Ray would wait
    for such resources forever. GPUs are those Ray counts, logical ones included (a rehearsal of
    GPU scheduling, whose trials decide their device: ``sweeps.running.trial.trial_device``)."""
    if spec.resources.gpu > gpus:
        raise ConfigError(
            f"{spec.source}: resources.gpu={spec.resources.gpu} per trial, but "
            f"{'no GPU is' if not gpus else f'only {gpus:g} GPUs are'} available; set resources.gpu=0 "
            "to train on CPUs (to rehearse GPU scheduling without GPUs, start a cluster with logical "
            "ones, `seqae cluster up --gpus-per-worker N`, and set SEQAE_LOGICAL_GPUS=1)"
        )
    if spec.resources.cpu > cpus:
        raise ConfigError(
            f"{spec.source}: resources.cpu={spec.resources.cpu} per trial, but only {cpus:g} CPUs are available"
        )


def cluster_totals() -> tuple[float, float]:
    """(CPUs, GPUs) of all the alive nodes of the connected Ray cluster together: the trial slots
    the cluster's sweeps share (sweeps.stores.shares)."""
    total = ray.cluster_resources()
    return float(total.get("CPU", 0.0)), float(total.get("GPU", 0.0))


def check_address(address: str) -> None:
    """Refuse a ``RAY_ADDRESS`` of ``host:port`` where nothing listens: ``ray.init`` would retry for
    minutes, printing only its own warnings. Other forms (``auto``, ``ray://``) are left to Ray."""
    where = re.fullmatch(r"([\w.-]+):(\d+)", address)
    if where is None:
        return
    try:
        socket.create_connection((where[1], int(where[2])), timeout=5).close()
    except OSError as exc:
        raise ConfigError(
            f"RAY_ADDRESS={address!r}: no Ray cluster answers there ({exc.strerror or exc}); start "
            "one (`ray start --head`, `seqae cluster up`) or unset RAY_ADDRESS to run on a local Ray"
        ) from None


def connect_ray(home: Path) -> None:
    """Join the cluster named by RAY_ADDRESS, or start a local one that lives with this process.

    In a cluster the driver then works from ``home`` (the workspace): the node may unpack a Ray
    Job's package again, at the same path, whenever a runtime env is set up, which leaves a
    driver inside it in a deleted folder. Paths are absolute by then."""
    os.environ.setdefault("RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS", "0")
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        check_address(os.environ["RAY_ADDRESS"])
        ray.init(address=os.environ["RAY_ADDRESS"], logging_level=logging.WARNING)
        home.mkdir(parents=True, exist_ok=True)
        os.chdir(home)
    else:
        # A new local cluster turns on token authentication (Ray's default, kept) and warns that it
        # did, on every sweep: nothing a seqae user can act on. (Setting RAY_AUTH_MODE here instead
        # would be too late: Ray read its configuration when it was imported.)
        RP.quiet_token_setup()
        # Ray starts a worker per CPU for the first driver, for its tasks to start sooner. A sweep's
        # trials are Tune actors, started with their own resources: the prestarted workers were
        # seldom given one, and each spent CPU starting, at every sweep's start (measured:
        # docs/explanation/performance.md, "No idle workers for a sweep's own Ray").
        # address="local": without it ray.init joins a cluster that `ray start` left running on
        # this machine (and refuses the _system_config below), where a local sweep was asked for.
        ray.init(
            address="local",
            include_dashboard=False,
            logging_level=logging.WARNING,
            _system_config={"prestart_worker_first_driver": False},
        )
