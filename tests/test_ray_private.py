"""Ray's private names, each read through one function of sweeps/running/ray_private.py, exercised
on the installed Ray's own classes; and the installed Ray one of the versions they were checked
against (``CHECKED_RAY``), else one message that says what to re-check.

What needs a running cluster is exercised here up to Ray's own check that one runs, and for real
by the slow tests the message names: the leaving-node tests (tests/test_eviction.py) drain a node
and watch for its draining on a local cluster of several nodes, where Tune keeps no process for a
next trial (``may_reuse_actors``); every sweep test asks for that on a cluster of one node."""

from __future__ import annotations

import importlib
import inspect
import logging

import numpy as np
import pytest
import ray
import ray._raylet
from ray.exceptions import RaySystemError
from ray.tune.execution.tune_controller import TuneController
from ray.tune.experiment import Experiment, Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.search import Searcher, SearchGenerator

from sweeps.running import ray_private as RP

RECHECK = (
    f"Ray {ray.__version__} is not one that sweeps/running/ray_private.py was checked against "
    f"({', '.join(RP.CHECKED_RAY)}): read each of its functions against this Ray's source (ASHA's brackets, rungs "
    "and trials in ray/tune/schedulers/async_hyperband.py; TuneController._update_trial_queue and its caller; "
    "whether Tune still counts a kept process's death twice when its node dies (may_reuse_actors); the draining "
    "calls of ray/_private/state.py and the GCS client; the Jobs API's upload limits; the token-setup logger), "
    "run tests/test_ray_private.py and the slow tests docs/how-to/maintain.md lists under "
    f"'Upgrading Ray', then add {ray.__version__!r} to CHECKED_RAY"
)


def test_the_installed_ray_is_one_its_private_names_were_checked_against():
    assert ray.__version__ in RP.CHECKED_RAY, RECHECK


def _trial(trial_id: str) -> Trial:
    return Trial("ray-private", config={}, trial_id=trial_id, stub=True)


def test_ashas_brackets_rungs_and_trials_are_the_ones_its_decisions_read():
    """Factor 2 to 8 epochs in two brackets: rungs at 8, 4, 2, 1 and at 8, 4, 2. A value written into
    a rung counts in Ray's next decision there; the trial placed in a bracket is decided there."""
    asha = ASHAScheduler(
        time_attr="epoch", metric="acc", mode="max", max_t=8, grace_period=1, reduction_factor=2, brackets=2
    )
    first, second = RP.brackets(asha)
    assert [[m for m, _ in RP.rungs(b)] for b in (first, second)] == [[8, 4, 2, 1], [8, 4, 2]]
    assert (RP.time_attr(asha), RP.max_t(asha), RP.reduction_factor(first)) == ("epoch", 8.0, 2.0)

    trial = _trial("a")
    asha.on_trial_add(None, trial)
    RP.place_trial(asha, "a", second)
    assert RP.bracket_of_trial(asha, "a") is second
    dict(RP.rungs(second))[2]["earlier"] = 0.9  # as a rebuilt rung holds an earlier session's trial
    assert asha.on_trial_result(None, trial, {"epoch": 2, "acc": 0.5}) == TrialScheduler.STOP
    assert dict(RP.rungs(second))[2] == {"earlier": 0.9, "a": 0.5}  # Ray recorded it in the dict read
    assert RP.cutoff(second, {"x": 1.0, "y": 3.0}) == np.nanpercentile([1.0, 3.0], 50)
    RP.forget_trial(asha, "a")
    with pytest.raises(KeyError):
        RP.bracket_of_trial(asha, "a")


def test_a_raced_brackets_cutoff_is_the_rule_ray_decides_by():
    asha = ASHAScheduler(time_attr="epoch", metric="acc", mode="max", max_t=4, grace_period=1, reduction_factor=2)
    (bracket,) = RP.brackets(asha)
    RP.race(bracket, lambda recorded: max(recorded.values()) if recorded else None)
    for trial_id, acc, decision in (
        ("a", 0.5, TrialScheduler.CONTINUE),
        ("b", 0.6, TrialScheduler.CONTINUE),
        ("c", 0.55, TrialScheduler.STOP),
    ):  # ASHA's median rule would let c on
        trial = _trial(trial_id)
        asha.on_trial_add(None, trial)
        assert asha.on_trial_result(None, trial, {"epoch": 1, "acc": acc}) == decision
    assert RP.cutoff(bracket, {"x": 0.2, "y": 0.7}) == 0.7


def test_tunes_wait_for_a_trial_is_the_default_the_sweep_sets():
    """Tune's step that waits for its searcher takes its timeout from the method's default (its
    caller passes none); the runner sets it on import (sweeps.running.runner)."""
    from sweeps.running import runner  # noqa: F401 - it sets Tune's wait on import
    from sweeps.running.slots import EVERY_SECONDS

    timeout = inspect.signature(TuneController._update_trial_queue).parameters["timeout"]
    assert timeout.default == EVERY_SECONDS
    assert "self._update_trial_queue(blocking=" in inspect.getsource(TuneController._maybe_update_trial_queue)
    try:
        RP.limit_searcher_wait(7)
        assert list(inspect.signature(TuneController._update_trial_queue).parameters) == ["self", "blocking", "timeout"]
        assert inspect.signature(TuneController._update_trial_queue).parameters["timeout"].default == 7
    finally:
        RP.limit_searcher_wait(EVERY_SECONDS)


def test_a_searcher_that_returns_the_finished_sentinel_ends_tunes_search():
    class Done(Searcher):
        def suggest(self, trial_id):
            return RP.search_finished()

    search = SearchGenerator(Done())
    search.add_configurations([Experiment("ray-private", lambda config: None)])
    assert search.next_trial() is None and search.is_finished()


def test_draining_asks_rays_state_and_gcs_client_as_ray_drain_node_does():
    """Without a cluster, each call gets as far as Ray's connection: the reason's name is looked up,
    the connected worker's GCS client is the one missing."""
    parameters = list(inspect.signature(ray._raylet.InnerGcsClient.drain_node).parameters)
    assert parameters[:5] == ["self", "node_id", "reason", "reason_message", "deadline_timestamp_ms"]
    assert not ray.is_initialized()
    with pytest.raises(AttributeError, match="gcs_client"):
        RP.drain_for_preemption("0" * 56, "ray_private's test")
    with pytest.raises(RaySystemError, match="ray.init"):
        RP.draining_nodes()


def test_the_jobs_apis_upload_limit_and_the_token_setup_logger_are_rays():
    assert 0 < RP.job_upload_limit() <= 512 * 2**20
    module = importlib.import_module(RP.TOKEN_SETUP_LOGGER)
    assert module.logger.name == RP.TOKEN_SETUP_LOGGER  # the logger that warns is the one silenced
    before = module.logger.level
    try:
        RP.quiet_token_setup()
        assert not module.logger.isEnabledFor(logging.WARNING)
    finally:
        module.logger.setLevel(before)
