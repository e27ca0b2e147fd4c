"""Every read of Ray's private names, and each workaround of a Ray bug, in one place: one function
each, whose docstring says which public behaviour it stands in for. A Ray upgrade is the riskiest
change this project can take; it is checked here. ``CHECKED_RAY`` names the Ray versions these
functions were read against, and tests/test_ray_private.py exercises each one on the installed
Ray's own classes and fails on any other version with the list of what to re-check
(docs/how-to/maintain.md, "Upgrading Ray").

Ray Tune's classes are imported inside the functions that need them: :mod:`sweeps.running.package`
reads its limits here on ``seqae sweep submit``'s way, which does not otherwise import Tune."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import ray
from ray._private import ray_constants
from ray._private import state as ray_state
from ray._private import worker as ray_worker
from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE
from ray.core.generated import autoscaler_pb2

if TYPE_CHECKING:
    from ray.tune.schedulers import AsyncHyperBandScheduler
    from ray.tune.schedulers.async_hyperband import _Bracket as Bracket

# The Ray versions every function below was read against (its source) and tested on.
CHECKED_RAY = ("2.60.0",)
# What a rung records of a trial: the objective's value, turned to be maximized (Ray's ASHA), or
# every objective's so (sweeps.running.schedulers.ParetoASHA).
RungValue = float | tuple[float, ...]


# ASHA's rungs (ray.tune.schedulers.async_hyperband): Tune keeps them in the driver's memory only and
# offers no public view of them (ray-project/ray#30838); sweeps.running.schedulers rebuilds them
# after a driver's crash, races them and ranks them by several objectives.


def brackets(asha: AsyncHyperBandScheduler) -> list[Bracket]:
    """ASHA's brackets (``brackets=`` of them; asynchronous Hyperband's), in Ray's order: the
    ``_brackets`` Ray draws a new trial's bracket from in ``on_trial_add``."""
    return asha._brackets


def rungs(bracket: Bracket) -> list[tuple[float, dict[str, RungValue]]]:
    """A bracket's rungs, the highest milestone first: ``(milestone, {trial id: value recorded})``,
    Ray's own dicts (``_Bracket._rungs``), which its ``on_result`` records into and decides from: a
    value written into one counts in Ray's next decision at that rung."""
    return bracket._rungs


def reduction_factor(bracket: Bracket) -> float:
    """The bracket's ``reduction_factor``: a rung lets the best 1 in it go on (``_Bracket.rf``)."""
    return float(bracket.rf)


def cutoff(bracket: Bracket, recorded: dict[str, RungValue]) -> Any:
    """The value below which a trial reaching a rung that holds ``recorded`` stops (None while it
    holds none): the rule ``_Bracket.on_result`` applies, as :func:`race` may have set it."""
    return bracket.cutoff(recorded)


def race(bracket: Bracket, rule: Any) -> None:
    """Make ``rule(recorded)`` the bracket's cutoff: ``_Bracket.on_result`` calls ``self.cutoff``,
    so setting it on the instance changes the rule ASHA decides by, and only that."""
    bracket.cutoff = rule  # type: ignore[method-assign]


def bracket_of_trial(asha: AsyncHyperBandScheduler, trial_id: str) -> Bracket:
    """The bracket ASHA placed Tune trial ``trial_id`` in (``_trial_info``)."""
    return asha._trial_info[trial_id]


def place_trial(asha: AsyncHyperBandScheduler, trial_id: str, bracket: Bracket) -> None:
    """Put Tune trial ``trial_id`` in ``bracket``, in place of the one ``on_trial_add`` drew at random:
    ASHA's ``on_trial_result`` and ``on_trial_complete`` read it from ``_trial_info``."""
    asha._trial_info[trial_id] = bracket


def forget_trial(asha: AsyncHyperBandScheduler, trial_id: str) -> None:
    """Drop Tune trial ``trial_id`` from ASHA's trials, as its ``on_trial_complete`` does."""
    del asha._trial_info[trial_id]


def time_attr(asha: AsyncHyperBandScheduler) -> str:
    """The result key ASHA counts a trial's progress in (its ``time_attr=``, kept as ``_time_attr``)."""
    return asha._time_attr


def max_t(asha: AsyncHyperBandScheduler) -> float:
    """The progress at which ASHA stops a trial (its ``max_t=``, kept as ``_max_t``)."""
    return float(asha._max_t)


# Tune's loop on the driver (ray.tune.execution.tune_controller, ray.tune.search).


def limit_searcher_wait(seconds: float) -> None:
    """Make Tune's step that asks the searcher for a trial, while Tune holds none, give up after
    ``seconds`` instead of ten minutes. ``TuneController._update_trial_queue(blocking, timeout)``
    asks once a second for up to ``timeout``, and its caller passes no timeout: its default is the
    wait (no public setting reaches it). Every TuneController of the process takes it."""
    from ray.tune.execution.tune_controller import TuneController

    TuneController._update_trial_queue.__defaults__ = (False, seconds)


def search_finished() -> Any:
    """What a searcher's ``suggest`` returns once the search has no trial left: Tune's own
    sentinel, the string ``Searcher.FINISHED``, where the method's signature says a dict or None."""
    from ray.tune.search import Searcher

    return Searcher.FINISHED


def may_reuse_actors() -> bool:
    """Whether a session may keep an ended trial's process for the next trial (Tune's
    ``reuse_actors``): only on a cluster of one node, where no node is lost alone. Tune counts the
    death of a kept process twice when its node dies between two trials, and fails the next trial
    whatever its retries (a Ray bug, seen on 2.60)."""
    return sum(node["Alive"] for node in ray.nodes()) == 1


# A node leaving (its worker drained for preemption), seen from a trial's worker: what Ray Train's
# preemption watcher and `ray drain-node` do, through Ray's private GCS client.


def draining_nodes() -> set[str]:
    """The ids (hex) of the cluster's nodes being drained: Ray Train's preemption watcher's question
    (``ray._private.state.state.get_draining_nodes``). Needs a connected worker or driver."""
    return set(ray_state.state.get_draining_nodes())


def drain_for_preemption(node: str, message: str) -> None:
    """Ask the GCS to drain node ``node`` (hex id) for preemption, with no deadline: the call
    ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`` makes, through the connected worker's
    GCS client. No new work is placed there, and an actor that dies there is a preempted one, which
    Tune does not count among a trial's failures."""
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")  # type: ignore[attr-defined]
    gcs = ray_worker.global_worker.gcs_client  # type: ignore[attr-defined]  # set once connected
    gcs.drain_node(node, reason, message, 0)


# Ray's limits and log messages, read where a public setting would be.


def job_upload_limit() -> int:
    """The largest working directory Ray's Jobs API takes, in bytes: the dashboard's HTTP request
    limit (``ray_constants.DASHBOARD_CLIENT_MAX_SIZE``) and the GCS's message limit behind it
    (``runtime_env.packaging.GCS_STORAGE_MAX_SIZE``), whichever is smaller."""
    return min(int(ray_constants.DASHBOARD_CLIENT_MAX_SIZE), int(GCS_STORAGE_MAX_SIZE))


# The module whose logger warns, on every new local cluster, that token authentication was turned on.
TOKEN_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"


def quiet_token_setup() -> None:
    """Silence the warning a new local cluster logs that it turned token authentication on (Ray's
    default, which seqae keeps): Ray offers no setting for it, so its module's logger is raised to
    ERROR."""
    logging.getLogger(TOKEN_SETUP_LOGGER).setLevel(logging.ERROR)
