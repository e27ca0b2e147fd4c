"""Who acts on a sweep, and whether they may.

A sweep belongs to the user who made it: its ``sweep.json``, its submission record, its Optuna
study, its MLflow experiment, runs and registered model, and its Ray jobs record that user. Who
acts is the MLflow user (``MLFLOW_TRACKING_USERNAME``), else the operating system's; a submitted
sweep's driver runs on the cluster's head as the head's user, so its job carries the submitting
user in :data:`USER`, which comes first. Stopping, changing, resuming, extending or cancelling a
sweep is for its owner and MLflow's admin; reading one (status, export, a fork's seed) is for
anyone. A sweep recorded before owners were (no owner) is anyone's.

These checks keep the members of one team from acting on each other's sweeps by mistake; they
are no wall against a user who edits the records or holds the cluster's credentials."""

from __future__ import annotations

import getpass
import os

from seqae_errors import ConfigError

USER = "SEQAE_USER"  # a submitted job's: the user it acts for (set by `seqae sweep submit|resume`)
# MLflow's admin, who may act on any sweep (cluster.mlflow_server.ADMIN: the sweep service does not import cluster)
ADMIN = "admin"


def actor() -> str:
    """Who acts: :data:`USER` (a submitted job's driver), else the MLflow user, else the OS user."""
    named = os.environ.get(USER) or os.environ.get("MLFLOW_TRACKING_USERNAME")
    if named:
        return named
    try:
        return getpass.getuser()
    except OSError:  # a container's user with no name (no passwd entry, no LOGNAME or USER)
        return f"uid-{os.getuid()}"


def check(name: str, owner: str | None, verb: str) -> str:
    """Who acts on sweep ``name`` (owned by ``owner``; None: anyone's) to ``verb`` it, as its logs
    name them (an admin acting on another's sweep says so); refused for anyone else."""
    who = actor()
    if owner is None or who == owner:
        return who
    if who == ADMIN:
        return f"{who} (an MLflow admin, on {owner}'s sweep)"
    raise ConfigError(f"sweep {name!r} belongs to {owner}; {who} may not {verb} it (an MLflow admin may)")
