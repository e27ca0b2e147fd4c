"""Owners (sweeps/stores/ownership.py): every sweep records the user who made it, and stopping,
changing, resuming, extending or cancelling it is for that user and MLflow's admin. The fast tests
create sweeps through the real `Sweep.create` (no Ray: the checks come before any driver) on a
real Optuna study (SQLite); the slow one runs a tiny sweep to its end and acts on it through the
command line and the Python API."""

from __future__ import annotations

import getpass
import json
import shutil
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from cluster import mlflow_server
from seqae import Sweep
from seqae.cli.main import main
from seqae_core import names as N
from seqae_errors import ConfigError
from sweeps.running import lifecycle
from sweeps.spec import sweep as spec_lib
from sweeps.stores import ownership
from sweeps.stores.search import open_study, read_only
from sweeps.stores.search import storage as optuna_storage
from sweeps.stores.workspace import Submission, Workspace
from tests import sweep_helpers as helpers
from tests.conftest import WIKI_MINI
from tests.refusal import assert_refused
from tests.sweep_helpers import STUDIES, run_args, seqae, status

QUICKSTART = STUDIES / "quickstart.yaml"
SETS = [f"data.path={WIKI_MINI}", "trials.total=5"]


def as_user(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Act as MLflow user ``name`` from now on."""
    monkeypatch.delenv(ownership.USER, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", name)


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    workspace = Workspace(tmp_path / "ws")
    workspace.root.mkdir()
    optuna_storage(f"sqlite:///{workspace.root / 'optuna.db'}")
    return workspace


@pytest.fixture
def alices(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> str:
    """A sweep alice created (`Sweep.create`, as `seqae sweep run` does first) whose study exists,
    as its driver makes it; the name."""
    as_user(monkeypatch, "alice")
    name = Sweep.create(QUICKSTART, set=SETS, name="hers", workspace=workspace).name
    state = workspace.read(name)
    open_study(state.spec, state.backends.optuna_storage, name, state.total_trials, state.fingerprint)
    return name


def test_who_acts_is_the_jobs_user_then_the_mlflow_user_then_the_os_user(monkeypatch):
    monkeypatch.delenv(ownership.USER, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "")
    assert ownership.actor() == getpass.getuser()  # set but empty: not a name
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    assert ownership.actor() == "bob"
    monkeypatch.setenv(ownership.USER, "alice")  # a submitted job's driver acts for whoever submitted it
    assert ownership.actor() == "alice"
    assert ownership.ADMIN == mlflow_server.ADMIN  # the sweep service's name for MLflow's admin is MLflow's


def test_another_user_may_not_stop_set_resume_extend_or_run_over_a_users_sweep(workspace, alices, monkeypatch, capsys):
    """Bob is refused in one line, through the API and the command line, before anything changes."""
    state = workspace.read(alices)
    assert state.owner == "alice"
    as_user(monkeypatch, "bob")
    refusal = "sweep 'hers' belongs to alice; bob may not {} it (an MLflow admin may)"
    sweep = Sweep(alices, workspace)
    for verb, act in (
        ("stop", lambda: sweep.stop()),
        ("set", lambda: sweep.set(max_concurrent=3)),
        ("resume", lambda: sweep.resume()),
        ("extend", lambda: sweep.extend(trials=2)),
        ("resume", lambda: Sweep.run(QUICKSTART, set=SETS, name=alices, workspace=workspace, or_resume=True)),
    ):
        with pytest.raises(ConfigError) as refused:
            act()
        assert str(refused.value) == refusal.format(verb), verb
    for argv, verb in (
        (["stop", alices], "stop"),
        (["stop", alices, "--now"], "stop"),
        (["set", alices, "max_concurrent=3"], "set"),
        (["resume", alices], "resume"),
        (["extend", alices, "--trials", "2"], "extend"),
    ):
        code = main(["sweep", *argv, "--workspace", str(workspace.root)])
        assert_refused(
            code, capsys.readouterr().err, refusal.format(verb), created=(workspace.sweep_dir(alices) / "driver.lock",)
        )
    assert read_only(state.spec, state.backends.optuna_storage, alices).control().log == ()  # nothing was recorded
    assert workspace.read(alices).extra_trials == 0 and workspace.read(alices).sessions == []


def test_the_owner_and_the_admin_may_and_the_control_log_names_who_did(workspace, alices, monkeypatch):
    Sweep(alices, workspace).set(max_concurrent=2)  # alice, its owner
    as_user(monkeypatch, "admin")
    Sweep(alices, workspace).stop()
    state = workspace.read(alices)
    control = read_only(state.spec, state.backends.optuna_storage, alices).control()
    assert [(entry["by"], entry.get("drain")) for entry in control.log] == [
        ("alice", None),
        ("admin (an MLflow admin, on alice's sweep)", "stopped by admin from Python"),
    ]
    assert status(alices, workspace.root)["owner"] == "alice"  # `seqae sweep status --json`


def test_a_fork_of_anothers_sweep_is_the_forkers_and_reads_the_origin_only(workspace, alices, monkeypatch):
    """Reading a sweep is for anyone (status, export, the trials a fork seeds its study with): bob's
    fork of alice's sweep is bob's, and alice's sweep is as it was."""
    as_user(monkeypatch, "bob")
    name = lifecycle.fork(workspace, alices, str(QUICKSTART), "his", SETS, {})
    assert workspace.read(name).owner == "bob" and workspace.read(name).forked_from == alices
    assert workspace.read(alices).owner == "alice"


def test_a_sweep_recorded_before_owners_loads_and_is_anyones(workspace, alices, monkeypatch):
    """An old ``sweep.json`` has no owner: it loads, and anyone may act on it (it cannot be told
    whose it was); a study with no owner falls back to the record's."""
    path = workspace.sweep_dir(alices) / "sweep.json"
    document = json.loads(path.read_text())
    del document["owner"]
    path.write_text(json.dumps(document))
    assert workspace.read(alices).owner is None
    as_user(monkeypatch, "bob")
    assert Sweep(alices, workspace).stop("an old sweep").drain == "an old sweep"


def test_the_studys_owner_is_checked_where_only_the_study_is_reached(workspace, tmp_path, monkeypatch):
    """A submitted sweep's control reaches it through its study: the owner its driver recorded there
    (bob's submission record says nothing of it: he did not submit it) refuses bob."""
    source = tmp_path / "project"
    source.mkdir()
    shutil.copy(QUICKSTART, source / "quick.yaml")
    url = f"sqlite:///{workspace.root / 'optuna.db'}"
    workspace.write_submission(
        Submission(
            name="remote",
            address="http://127.0.0.1:9",
            file="quick.yaml",
            sets=SETS,
            workspace="/cluster/ws",
            working_dir=str(source),
            jobs=["seqae-remote-1"],
            backends=workspace.default_backends("remote"),
        )
    )
    spec = spec_lib.load(source / "quick.yaml", SETS)
    open_study(spec, url, "remote", spec.planned_trials(), spec.fingerprint()).claim("alice")
    assert optuna.load_study(study_name="remote", storage=url).user_attrs[N.OWNER] == "alice"
    as_user(monkeypatch, "bob")
    with pytest.raises(ConfigError, match="^sweep 'remote' belongs to alice; bob may not stop it"):
        Sweep("remote", workspace).stop()


def test_another_user_may_not_cancel_or_resubmit_a_submitted_sweep(workspace, tmp_path, monkeypatch, capsys):
    """Refused from the submission record, before the cluster (here: none) is asked anything."""
    workspace.write_submission(
        Submission(
            name="remote",
            address="http://127.0.0.1:9",
            file="quickstart.yaml",
            sets=SETS,
            workspace="/cluster/ws",
            working_dir=str(STUDIES),
            jobs=["seqae-remote-1"],
            owner="alice",
        )
    )
    as_user(monkeypatch, "bob")
    for verb in ("cancel", "resume"):
        code = main(["sweep", verb, "remote", "--workspace", str(workspace.root)])
        assert_refused(
            code,
            capsys.readouterr().err,
            f"sweep 'remote' belongs to alice; bob may not {verb} it",
            created=(tmp_path / "nothing",),
        )
    assert workspace.read_submission("remote").jobs == ["seqae-remote-1"]  # no job was added


@pytest.mark.slow
def test_a_run_sweep_records_its_owner_everywhere_and_only_its_owner_and_the_admin_act_on_it(tmp_path, monkeypatch):
    """A tiny sweep run by alice: her name on its record, study, experiment, runs and model and in
    `status --json`; bob's `stop`, `set`, `extend` and `resume` are refused, as is his Python stop;
    the admin's extend runs, its driver saying whose sweep it drives, and its session names the admin."""
    workspace, name = tmp_path / "ws", "owned"
    as_user(monkeypatch, "alice")
    run = seqae(*run_args(workspace, name, "trials.total=1", "train.epochs=1"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    info = status(name, workspace)
    assert info["owner"] == "alice"
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{workspace / 'optuna.db'}")
    assert study.user_attrs[N.OWNER] == "alice"
    runs = helpers.mlflow_runs(workspace, name)
    assert len(runs) == 2 and {r.data.tags.get(N.OWNER) for r in runs} == {"alice"}  # the sweep's run and the trial's
    client = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
    assert client.get_experiment_by_name(name).tags[N.OWNER] == "alice"
    assert client.get_registered_model(name).tags[N.OWNER] == "alice"

    as_user(monkeypatch, "bob")
    for argv, verb in (
        (["stop", name], "stop"),
        (["set", name, "max_concurrent=2"], "set"),
        (["extend", name, "--trials", "1"], "extend"),
        (["resume", name], "resume"),
    ):
        refused = seqae("sweep", *argv, "--workspace", str(workspace))
        assert (
            refused.returncode == 2
            and (f"seqae: error: sweep {name!r} belongs to alice; bob may not {verb} it (an MLflow admin may)")
            in refused.stderr
        ), (argv, refused.stderr)
    with pytest.raises(ConfigError, match="belongs to alice; bob may not stop it"):
        Sweep(name, workspace).stop()
    assert status(name, workspace)["trials_total"] == 1 and status(name, workspace)["control"]["log"] == []

    as_user(monkeypatch, "admin")
    extended = seqae("sweep", "extend", name, "--trials", "1", "--workspace", str(workspace))
    assert extended.returncode == 0, extended.stdout[-3000:] + extended.stderr[-3000:]
    assert "seqae: admin (an MLflow admin, on alice's sweep) drives it" in extended.stdout, extended.stdout[-3000:]
    stopped = seqae("sweep", "stop", name, "--workspace", str(workspace))
    assert stopped.returncode == 0, stopped.stderr
    info = status(name, workspace)
    assert info["owner"] == "alice" and info["trials_total"] == 2
    assert info["control"]["drain"] == "stopped by admin with `seqae sweep stop`"
    assert info["control"]["log"][-1]["by"] == "admin (an MLflow admin, on alice's sweep)"
    sessions = json.loads((workspace / "sweeps" / name / "sweep.json").read_text())["sessions"]
    assert [s["user"] for s in sessions] == ["alice", "admin"]
