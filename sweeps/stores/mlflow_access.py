"""Whether MLflow may be written to: a refusal of the credentials stops a command at once (it
is no outage), while a server or database that is away is an outage the writer waits out;
reading every run of an experiment, however many, and finding its sweep's parent run; and MLflow's
process-wide URIs, for the calls that read no other."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import mlflow
import requests
import sqlalchemy.exc
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from seqae_core import names as N
from seqae_errors import ConfigError
from sweeps.stores.outages import Service, retry_seconds, waited_for
from sweeps.stores.ownership import USER
from sweeps.stores.workspace import redact

log = logging.getLogger(__name__)
T = TypeVar("T")
# On a cluster's head (cluster/accounts.py): the folder of its users' MLflow passwords, one file a user
ACCOUNTS_ENV = "SEQAE_MLFLOW_ACCOUNTS"
# How MLflow's server answers a Host it does not allow (mlflow.server.security_utils.INVALID_HOST_MSG;
# importing that loads the whole server at every start)
INVALID_HOST = "Invalid Host header - possible DNS rebinding attack detected"


def find_sweep_run(client: MlflowClient, experiment_id: str) -> Run | None:
    """The sweep's parent run in its experiment (the first, if a killed driver left two)."""
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{N.ROLE}` = '{N.ROLE_SWEEP}'",
        order_by=["attributes.start_time ASC"],
        max_results=1,
    )
    return found[0] if found else None


def unreachable(exc: BaseException) -> bool:
    """Whether a failed write may succeed later: the server or database is away, not a bug. A
    server that refuses the credentials is no outage: waiting would not change its answer."""
    return isinstance(
        exc, (MlflowException, OSError, requests.RequestException, sqlalchemy.exc.OperationalError)
    ) and not _refused(exc)


def _refused(exc: BaseException) -> bool:
    """The tracking server's authentication said no: 401 (no or wrong credentials) or 403."""
    return isinstance(exc, MlflowException) and exc.get_http_status_code() in (401, 403)


def waiting_for_mlflow(uri: str, what: str, call: Callable[[], T]) -> T:
    """``call()``, retried while the MLflow server at ``uri`` is away, for as long as a study's
    database is waited for (:func:`sweeps.stores.outages.retry_seconds`): what a driver cannot start
    without (its experiment and parent run, its trials' runs reconciled) has no writer to keep it
    for later. ``call`` must look before it writes, since an attempt may be cut short. A server
    away past the limit ends in :class:`~seqae_errors.StorageUnreachable`, which names it."""
    service = Service("MLflow", f"MLflow at {redact(uri)}", "check that its server is up and reachable")
    return waited_for(service, what, call, unreachable, log, retry_seconds())


def sign_in_as_job_user() -> None:
    """On a cluster's head, where the drivers of submitted sweeps run (``$SEQAE_MLFLOW_ACCOUNTS``
    names its users' password files): this process's MLflow credentials become those of the user
    its job acts for (``$SEQAE_USER``: who submitted or resumed it), where MLflow's client reads
    them, so the sweep's experiment, runs and models are written as that user. Elsewhere it does
    nothing."""
    folder = os.environ.get(ACCOUNTS_ENV)
    if not folder:
        return
    owner = os.environ.get(USER, "")
    password = Path(folder) / owner
    if not owner or owner != password.name or not password.is_file():
        raise ConfigError(
            f"this cluster has no MLflow account for {repr(owner) if owner else 'the submitting user'} "
            f"({USER}): its admin creates one with `seqae cluster add-user NAME`, and the user "
            "submits after sourcing the env.sh it writes"
        )
    os.environ["MLFLOW_TRACKING_USERNAME"] = owner
    os.environ["MLFLOW_TRACKING_PASSWORD"] = password.read_text().strip()


def check_credentials(uri: str) -> None:
    """Stop at once, naming what to set, when the tracking server at ``uri`` refuses this
    process's credentials (``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, which
    MLflow's client reads; on a cluster's head, the submitting user's: :func:`sign_in_as_job_user`).
    A server that does not answer is left to the writer to wait out."""
    if not uri.startswith(("http://", "https://")):
        return
    sign_in_as_job_user()
    try:
        MlflowClient(uri).search_experiments(max_results=1)
    except MlflowException as exc:
        if not _refused(exc):
            return
        if INVALID_HOST in exc.message:  # the server's check of the name it is reached by, not of the user
            raise ConfigError(
                f"the MLflow server at {uri} refuses the Host {urlsplit(uri).netloc!r} with 403 (MLflow's protection "
                "against DNS rebinding; `seqae cluster services` allows 127.0.0.1 and localhost, on any port): reach it "
                "through a tunnel or port-forward on this machine's loopback, e.g. SEQAE_MLFLOW_TRACKING_URI=http://127.0.0.1:5000"
            ) from None
        user = os.environ.get("MLFLOW_TRACKING_USERNAME")
        who = f"user {user!r} (MLFLOW_TRACKING_USERNAME)" if user else "requests without credentials"
        raise ConfigError(
            f"the MLflow server at {uri} refuses {who} with {exc.get_http_status_code()}: set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to a user it accepts (for `seqae cluster up`'s "
            "server, `source` the env.sh it wrote)"
        ) from None


@contextlib.contextmanager
def fluent_uri(uri: str) -> Iterator[None]:
    """MLflow's fluent calls (``start_run``, ``log_model``, ``load_model`` of a ``models:/`` URI) take
    no URI: they read the process's tracking and registry URIs, which ``mlflow.set_*_uri`` also
    exports to the environment for subprocesses. Both name ``uri`` inside the block only, so a
    Python session that drives or reads a sweep keeps its own settings, and its later commands and
    clients do not find this sweep's database."""
    saved = {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        # None unsets each, as it was; MLflow's registry setter then leaves its variable behind
        mlflow.set_tracking_uri(saved["MLFLOW_TRACKING_URI"])  # type: ignore[arg-type]
        mlflow.set_registry_uri(saved["MLFLOW_REGISTRY_URI"])  # type: ignore[arg-type]
        if saved["MLFLOW_REGISTRY_URI"] is None:
            os.environ.pop("MLFLOW_REGISTRY_URI", None)
