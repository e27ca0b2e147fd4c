"""The way from `seqae sweep run` to its trials: what creating the sweep checked is handed to its
first session (``lifecycle.Checked``), not checked again. Counted by wrapping the real functions;
no Ray, no server (the backends are the workspace's SQLite files)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from seqae.api import Sweep
from sweeps.running import driver, lifecycle, ray_connection
from sweeps.running.ray_connection import Cluster
from sweeps.spec import sweep as spec_lib
from sweeps.stores.workspace import Workspace
from tests.sweep_helpers import SMOKE, STUDIES

SETS = [*SMOKE, "data.input_len=16", "model.latent_len=8", "trials.total=1"]


def counted(monkeypatch: pytest.MonkeyPatch, calls: Counter[str], label: str, *places: tuple[Any, str]) -> None:
    """Count each call of the function bound at ``places`` (a module or class, and a name), then call it."""
    real: Callable[..., Any] = getattr(*places[0])

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[label] += 1
        return real(*args, **kwargs)

    for owner, name in places:
        monkeypatch.setattr(owner, name, counting)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    found: Counter[str] = Counter()
    counted(monkeypatch, found, "state read", (Workspace, "read"))
    counted(monkeypatch, found, "trial configs checked", (spec_lib, "check_trial_configs"))
    counted(monkeypatch, found, "credentials checked", (lifecycle, "check_credentials"), (driver, "check_credentials"))
    counted(monkeypatch, found, "Ray joined", (ray_connection, "connect_ray"))
    return found


def open_first_session(workspace: Path, checked: lifecycle.Checked) -> driver.Session:
    """What `Sweep.run` does after creating the sweep, up to its trials: open the sweep (the API's
    object), then its driver's session."""
    sweep = Sweep(checked.name, workspace)
    sweep.workspace.known(checked.name)  # the driver's first step (driver.drive)
    return driver.open_session(sweep.workspace, checked.name, check_file=False, checked=checked)


def test_a_new_sweeps_first_session_reads_its_state_once_and_checks_nothing_again(tmp_path, calls):
    workspace = Workspace(tmp_path / "ws")
    checked = lifecycle.create(workspace, str(STUDIES / "quickstart.yaml"), None, SETS, {})
    assert checked.spec is not None and checked.mlflow == workspace.default_backends(checked.name).mlflow_tracking_uri
    assert calls == {"trial configs checked": 1, "credentials checked": 1}  # as the file loaded; no Ray: none here
    session = open_first_session(workspace.root, checked)
    try:
        assert session.state.name == checked.name and session.spec.fingerprint() == checked.spec.fingerprint()
        # the record once, by the session, under the sweep's lock; nothing checked twice; a local Ray joins with the trials
        assert calls == {"state read": 1, "trial configs checked": 1, "credentials checked": 1}
    finally:
        session.notifier.close()


def test_a_cluster_joined_as_the_sweep_was_created_is_not_joined_again(tmp_path, calls, monkeypatch):
    workspace = Workspace(tmp_path / "ws")
    checked = lifecycle.create(workspace, str(STUDIES / "quickstart.yaml"), None, SETS, {})
    # as if creating it had joined the cluster RAY_ADDRESS names: a session that joined again would be
    # refused here, as nothing answers at that address
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    joined = dataclasses.replace(checked, cluster=Cluster(cpus=2.0, gpus=0.0))
    session = open_first_session(workspace.root, joined)
    try:
        assert session.cluster == joined.cluster and calls["Ray joined"] == 0
    finally:
        session.notifier.close()


def test_a_sweep_taken_up_with_its_own_file_loads_and_checks_that_file_once(tmp_path, calls):
    workspace = Workspace(tmp_path / "ws")
    file = str(STUDIES / "quickstart.yaml")
    lifecycle.create(workspace, file, "taken", SETS, {})
    calls.clear()
    checked = lifecycle.create(workspace, file, "taken", SETS, {}, or_resume=True)  # `seqae sweep run --or-resume`
    assert checked.spec is not None and checked.mlflow is None  # an existing sweep: its credentials are the session's
    session = open_first_session(workspace.root, checked)
    try:
        assert calls == {
            "state read": 2,
            "trial configs checked": 1,
            "credentials checked": 1,
        }  # create's read, the session's
    finally:
        session.notifier.close()
