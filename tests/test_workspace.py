"""The workspace folder (``sweeps.stores.workspace``): sweep names and paths checked before anything is
written, the records of a sweep (``sweep.json``, ``submission.json``) read back as written, the
driver lock that keeps a second driver off a running sweep, and how a sweep's backends are picked
(flags, then ``SEQAE_*`` variables, then the workspace's own files).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqae.cli.main import main
from seqae_errors import ConfigError
from sweeps.spec import sweep as spec_lib
from sweeps.stores.workspace import (
    Backends,
    DriverLock,
    SessionRecord,
    Submission,
    SweepLocked,
    SweepState,
    Workspace,
    check_name,
    listing,
    moved,
    redact,
    resolve_backends,
)
from tests.refusal import assert_refused
from tests.sweep_helpers import STUDIES, TINY, sets

REPO = Path(__file__).resolve().parents[1]
ENV = ("SEQAE_MLFLOW_TRACKING_URI", "SEQAE_OPTUNA_STORAGE", "SEQAE_STORAGE", "SEQAE_WORKSPACE")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "runs")


LR_DIMS = STUDIES / "search_lr_dims.yaml"


def state(name: str = "lr-search", **changes) -> SweepState:
    fields = {
        "name": name,
        "spec": spec_lib.load(LR_DIMS),
        "fingerprint": "3f2a9c",
        "file": str(LR_DIMS),
        "sets": ["train.epochs=3"],
        "planned_trials": 8,
        "study_name": "seqae-lr-search",
        "backends": Backends("sqlite:////ws/mlflow.db", "sqlite:////ws/optuna.db", "/ckpt/lr-search"),
        "created": 1700000000.5,
    }
    return SweepState(**{**fields, **changes})


def submission(name: str = "lr-search", **changes) -> Submission:
    fields = {
        "name": name,
        "address": "http://head:8265",
        "file": "sweeps/studies/search_lr_dims.yaml",
        "sets": ["train.epochs=3"],
        "workspace": "/shared/seqae-runs",
        "working_dir": "/home/me/seqae",
    }
    return Submission(**{**fields, **changes})


# -- names -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("a", id="one-letter"),
        pytest.param("9lives", id="starts-with-digit"),
        pytest.param("paper_fig3.v2-rerun", id="dot-underscore-dash"),
        pytest.param("x" * 64, id="64-characters"),
    ],
)
def test_check_name_accepts_plain_file_names(name):
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name, reason",
    [
        pytest.param("x" * 65, "(65 characters (at most 64))", id="too-long"),
        pytest.param("../etc", "(a path)", id="dotdot-prefix"),
        pytest.param("a/b", "(a path)", id="slash"),
        pytest.param("a\\b", "(a path)", id="backslash"),
        pytest.param("a..b", "(a path)", id="dotdot-inside"),
        pytest.param("tab\there", "(control or direction characters)", id="control-character"),
        pytest.param("sweep\u202egnp", "(control or direction characters)", id="right-to-left-override"),
        pytest.param("a/" + "x" * 70, "(72 characters (at most 64); a path)", id="long-path"),
        pytest.param("", "is not allowed:", id="empty-no-reason"),
        pytest.param(".hidden", "is not allowed:", id="leading-dot-no-reason"),
        pytest.param("with space", "is not allowed:", id="space-no-reason"),
    ],
)
def test_check_name_refuses_with_the_reason(name, reason):
    with pytest.raises(ConfigError) as err:
        check_name(name)
    message = str(err.value)
    assert reason in message
    assert "use 1-64 letters, digits, '.', '_' or '-'" in message
    assert "\t" not in message and "\u202e" not in message  # shown escaped, never raw


def test_check_name_refuses_a_trailing_newline():
    with pytest.raises(ConfigError, match=r"\(control or direction characters\)"):
        check_name("sweep\n")


def test_check_name_refuses_a_non_string():
    with pytest.raises(ConfigError, match=r"sweep name '5' is not allowed: use"):
        check_name(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "uri, shown",
    [
        pytest.param("postgresql://user:secret@db/optuna", "postgresql://user:***@db/optuna", id="postgres"),
        pytest.param(
            "postgresql://user:secret@db:5432/optuna?sslmode=require",
            "postgresql://user:***@db:5432/optuna?sslmode=require",
            id="port-and-query",
        ),
        pytest.param("s3://AKIA:wJalr@bucket/runs", "s3://AKIA:***@bucket/runs", id="object-store"),
        pytest.param("http://user@mlflow:5000", "http://user@mlflow:5000", id="user-without-password"),
        pytest.param("sqlite:////tmp/runs/optuna.db", "sqlite:////tmp/runs/optuna.db", id="sqlite"),
        pytest.param("/data/ckpt", "/data/ckpt", id="plain-path"),
    ],
)
def test_redact_hides_only_the_password(uri, shown):
    assert redact(uri) == shown


# -- paths -------------------------------------------------------------------------------------
def test_inside_joins_under_the_root(ws):
    assert ws.inside("sweeps", "a", "trials") == ws.root / "sweeps" / "a" / "trials"
    assert ws.inside() == ws.root
    assert ws.sweep_dir("a") == ws.root / "sweeps" / "a"


@pytest.mark.parametrize(
    "parts",
    [
        pytest.param(("..", "elsewhere"), id="dotdot"),
        pytest.param(("sweeps", "..", "..", "x"), id="dotdot-deeper"),
        pytest.param(("/etc",), id="absolute"),
    ],
)
def test_inside_refuses_paths_leading_out(ws, parts):
    with pytest.raises(ConfigError, match="leads outside the workspace"):
        ws.inside(*parts)


def test_inside_refuses_a_symlink_leading_out_but_follows_one_within(ws, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws.root / "sweeps").mkdir(parents=True)
    (ws.root / "sweeps" / "escape").symlink_to(outside)
    (ws.root / "sweeps" / "alias").symlink_to(ws.root / "cache")

    with pytest.raises(ConfigError) as err:
        ws.inside("sweeps", "escape", "sweep.json")
    assert f"(to {outside.resolve() / 'sweep.json'})" in str(err.value)
    with pytest.raises(ConfigError, match="leads outside the workspace"):
        ws.sweep_dir("escape")
    assert ws.inside("sweeps", "alias") == ws.root / "sweeps" / "alias"


def test_check_paths_refuses_a_linked_cache_leading_out(ws, tmp_path):
    ws.check_paths("a")  # a fresh workspace: nothing leads out
    ws.root.mkdir(parents=True)
    (ws.root / "cache").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="cache leads outside the workspace"):
        ws.check_paths("a")


def test_check_writable_creates_the_root_and_leaves_no_probe(ws):
    ws.check_writable()
    assert ws.root.is_dir() and list(ws.root.iterdir()) == []


def test_check_writable_refuses_a_workspace_it_cannot_write(tmp_path):
    """A file where the workspace folder should be (permissions would not stop root, who runs CI)."""
    root = tmp_path / "runs"
    root.write_text("not a folder")
    with pytest.raises(ConfigError, match=rf"the workspace {root} is not writable: \w"):
        Workspace(root).check_writable()


# -- records -----------------------------------------------------------------------------------
def test_sweep_state_round_trips_through_sweep_json(ws):
    written = state(
        extra_trials=4,
        mlflow_experiment_id="7",
        mlflow_parent_run_id="ab12",
        sessions=[SessionRecord(1700000001.0, 4242, "alice", "node-1")],
        forked_from="lr-search-v1",
    )
    ws.write(written)

    path = ws.root / "sweeps" / "lr-search" / "sweep.json"
    assert json.loads(path.read_text())["fingerprint"] == "3f2a9c"
    assert [p.name for p in path.parent.iterdir()] == ["sweep.json"]  # no temporary file left
    read = ws.read("lr-search")
    assert read == written
    assert read.total_trials == 12
    assert ws.exists("lr-search") and not ws.exists("other")
    older = {**json.loads(path.read_text()), "job": None}  # the always-empty field earlier versions wrote
    path.write_text(json.dumps(older))
    assert ws.read("lr-search") == written


def test_writing_a_sweep_again_replaces_its_record(ws):
    ws.write(state(planned_trials=8))
    session = SessionRecord(started=1.0, pid=7, user="alice", host="h")
    ws.write(state(planned_trials=8, extra_trials=2, sessions=[session]))
    assert ws.read("lr-search").total_trials == 10
    assert ws.read("lr-search").sessions == [session]


def test_a_session_record_is_written_as_far_as_it_is_filled_in_and_read_back(ws):
    """sweep.json's sessions: a running one without its end's fields, an ended one with them; an
    entry an older version wrote (no user, no job) reads back, with them None."""
    running = SessionRecord(started=1.0, pid=7, user="alice", host="h")
    ended = SessionRecord(
        started=1.0,
        pid=7,
        user="alice",
        host="h",
        outcome="complete",
        interrupted=False,
        ended=2.0,
        control={"drain": None},
        trials={"COMPLETE": 2},
        mlflow_outage_seconds=0.0,
        mlflow_writes_pending=0,
        mlflow_writes_failed=0,
        optuna_outage_seconds=0.0,
    )
    ws.write(state(sessions=[running, ended]))
    path = ws.root / "sweeps" / "lr-search" / "sweep.json"
    written = json.loads(path.read_text())["sessions"]
    assert written[0] == {"started": 1.0, "pid": 7, "user": "alice", "host": "h", "outcome": "running", "job": None}
    assert list(written[1])[-5:] == [
        "trials",
        "mlflow_outage_seconds",
        "mlflow_writes_pending",
        "mlflow_writes_failed",
        "optuna_outage_seconds",
    ]
    assert ws.read("lr-search").sessions == [running, ended]
    older = json.loads(path.read_text())
    older["sessions"] = [{"started": 1.0, "pid": 7, "host": "h", "outcome": "interrupted"}]
    path.write_text(json.dumps(older))
    assert ws.read("lr-search").sessions == [SessionRecord(1.0, 7, None, "h", "interrupted")]


def test_read_of_an_unknown_sweep_names_the_sweeps_there(ws):
    with pytest.raises(ConfigError, match=r"no sweep named 'ghost' in .* \(sweeps there: none\)"):
        ws.read("ghost")
    ws.write(state("beta"))
    ws.write(state("alpha"))
    with pytest.raises(ConfigError) as err:
        ws.read("ghost")
    assert str(err.value) == f"no sweep named 'ghost' in {ws.root} (sweeps there: alpha, beta)"


def test_submission_round_trips_and_names_its_sweep_file(ws):
    assert ws.read_submission("lr-search") is None  # never submitted
    written = submission(
        jobs=["raysubmit_1", "raysubmit_2"],
        backends=Backends("http://mlflow:5000", "sqlite:////ws/optuna.db", "s3://b/lr-search"),
    )
    ws.write_submission(written)

    read = ws.read_submission("lr-search")
    assert read == written
    assert read.sweep_file == "/home/me/seqae/sweeps/studies/search_lr_dims.yaml"
    assert not ws.exists("lr-search")  # a submission is not the sweep's own state


def test_names_lists_sweeps_and_submissions_only(ws):
    assert ws.names() == []
    ws.write(state("run-here"))
    ws.write_submission(submission("on-cluster"))
    (ws.root / "sweeps" / "empty").mkdir()
    (ws.root / "sweeps" / "stray.txt").write_text("")
    assert ws.names() == ["on-cluster", "run-here"]


# -- the driver lock ---------------------------------------------------------------------------
TAKE = """
import os, sys
from pathlib import Path
from sweeps.stores.workspace import DriverLock, SweepLocked
try:
    with DriverLock(Path(sys.argv[1])):
        print("took", os.getpid())
except SweepLocked as exc:
    print("refused", exc)
"""


def take_elsewhere(path: Path) -> str:
    """Try the lock from a second process, as a second `seqae sweep run` would."""
    done = subprocess.run(
        [sys.executable, "-c", TAKE, str(path)], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_second_driver_is_refused_while_the_first_holds_the_sweep(ws):
    path = ws.sweep_dir("lr-search") / "driver.lock"
    with DriverLock(path) as lock:
        assert lock.holder.read_text().startswith(f"pid {os.getpid()} on ")
        answer = take_elsewhere(path)
    assert answer.startswith("refused sweep 'lr-search' is already running (pid ")
    assert f"(pid {os.getpid()} on " in answer
    assert "only one run or resume may drive it at a time" in answer

    answer = take_elsewhere(path)  # released: the next driver takes it
    assert answer.startswith("took ")
    other = answer.split()[1]
    assert other != str(os.getpid())
    assert (path.parent / "driver.lock.holder").read_text().startswith(f"pid {other} on ")


def test_the_lock_is_refused_in_process_as_a_sweep_locked_config_error(ws):
    path = ws.sweep_dir("lr-search") / "driver.lock"
    with DriverLock(path), pytest.raises(SweepLocked, match="already running"), DriverLock(path):
        pass  # pragma: no cover
    assert issubclass(SweepLocked, ConfigError)
    with DriverLock(path):  # and taken again once released
        pass


# -- backends ----------------------------------------------------------------------------------
def test_backends_default_to_the_workspace(ws):
    chosen = resolve_backends(ws, "lr-search", {"mlflow_tracking_uri": None, "optuna_storage": None, "storage": None})
    assert chosen == Backends(
        mlflow_tracking_uri=f"sqlite:///{ws.root / 'mlflow.db'}",
        optuna_storage=f"sqlite:///{ws.root / 'optuna.db'}",
        storage=str(ws.root / "sweeps" / "lr-search"),
    )
    assert chosen.local


FLAGS = {
    "mlflow_tracking_uri": ("SEQAE_MLFLOW_TRACKING_URI", "http://mlflow-flag:5000", "http://mlflow-env:5000"),
    "optuna_storage": ("SEQAE_OPTUNA_STORAGE", "postgresql://flag-db/optuna", "postgresql://env-db/optuna"),
    "storage": ("SEQAE_STORAGE", "s3://flag-bucket/runs", "s3://env-bucket/runs"),
}


@pytest.mark.parametrize("field", list(FLAGS))
@pytest.mark.parametrize(
    "flag, env, winner",
    [
        pytest.param(True, True, "flag", id="flag-beats-env"),
        pytest.param(False, True, "env", id="env-beats-default"),
        pytest.param(False, False, "default", id="default"),
    ],
)
def test_flags_beat_environment_beats_workspace(ws, monkeypatch, field, flag, env, winner):
    variable, flag_value, env_value = FLAGS[field]
    if env:
        monkeypatch.setenv(variable, env_value)
    chosen = resolve_backends(ws, "lr-search", {field: flag_value if flag else None})

    expected = {"flag": flag_value, "env": env_value, "default": getattr(ws.default_backends("lr-search"), field)}[
        winner
    ]
    if field == "storage" and winner != "default":
        expected += "/lr-search"
    assert getattr(chosen, field) == expected
    defaults = ws.default_backends("lr-search")
    for other in set(FLAGS) - {field}:
        assert getattr(chosen, other) == getattr(defaults, other)


@pytest.mark.parametrize(
    "field, uri, label",
    [
        pytest.param(
            "mlflow_tracking_uri",
            "http://me:hunter2@mlflow:5000",
            "the MLflow tracking URI http://me:***@mlflow:5000",
            id="mlflow",
        ),
        pytest.param(
            "optuna_storage",
            "postgresql://me:hunter2@db/optuna",
            "the Optuna storage postgresql://me:***@db/optuna",
            id="optuna",
        ),
        pytest.param("storage", "s3://AKIA:hunter2@bucket/runs", "the storage s3://AKIA:***@bucket/runs", id="storage"),
    ],
)
@pytest.mark.parametrize("given", ["flag", "env"])
def test_a_uri_carrying_a_password_is_refused_naming_the_backend(ws, monkeypatch, field, uri, label, given):
    if given == "env":
        monkeypatch.setenv(FLAGS[field][0], uri)
    with pytest.raises(ConfigError) as err:
        resolve_backends(ws, "lr-search", {field: uri} if given == "flag" else {})
    message = str(err.value)
    assert message.startswith(f"{label} carries a password; give it through the environment")
    assert "hunter2" not in message


@pytest.mark.parametrize(
    "storage, expected",
    [
        pytest.param("ckpts", "{cwd}/ckpts/lr-search", id="relative"),
        pytest.param("./a/../ckpts", "{cwd}/ckpts/lr-search", id="relative-dotted"),
        pytest.param("~/ckpts", "{home}/ckpts/lr-search", id="home"),
        pytest.param("/abs/ckpts", "/abs/ckpts/lr-search", id="absolute"),
        pytest.param("s3://bucket/runs", "s3://bucket/runs/lr-search", id="object-store"),
        pytest.param("gs://bucket/runs/", "gs://bucket/runs/lr-search", id="object-store-trailing-slash"),
    ],
)
def test_a_chosen_storage_gets_the_sweep_name_appended(ws, tmp_path, monkeypatch, storage, expected):
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    chosen = resolve_backends(ws, "lr-search", {"storage": storage})
    assert chosen.storage == expected.format(cwd=cwd.resolve(), home=home.resolve())


def test_the_default_storage_given_as_a_flag_is_kept_as_it_is(ws):
    default = str(ws.root / "sweeps" / "lr-search")
    assert resolve_backends(ws, "lr-search", {"storage": default}).storage == default


@pytest.mark.parametrize("bad", ["../x", "a/b", "%2e%2e%2f", "x" * 300, "abc\u202edef", "..", "-rf"])
def test_sweep_names_that_could_escape_are_refused(tmp_path, bad, capsys):
    workspace = tmp_path / "ws"
    code = main(["sweep", "run", str(STUDIES / "quickstart.yaml"), f"--name={bad}", "--workspace", str(workspace)])
    assert_refused(code, capsys.readouterr().err, "is not allowed", created=(workspace,))


def test_nul_bytes_and_symlinks_out_of_the_workspace_are_refused(tmp_path, capsys):
    with pytest.raises(ConfigError):
        check_name("a\x00b")
    with pytest.raises(ConfigError):
        Workspace(str(tmp_path / "ws\x00"))
    outside = tmp_path / "outside"
    outside.mkdir()
    for link in ("sweeps", "mlflow.db", "cache"):
        workspace = tmp_path / f"ws-{link}"
        workspace.mkdir()
        (workspace / link).symlink_to(outside / link)
        code = main(["sweep", "run", str(STUDIES / "quickstart.yaml"), "--workspace", str(workspace), *sets(*TINY)])
        assert_refused(code, capsys.readouterr().err, "leads outside the workspace", created=(outside / link,))
        assert list(outside.iterdir()) == []  # nothing written outside
        assert sorted(p.name for p in workspace.iterdir()) == [link]


# -- a workspace that moves --------------------------------------------------------------------
def test_a_path_inside_the_old_folder_moves_with_it_and_every_other_stays():
    old, new = Path("/laptop/ws"), Path("/disk/ws")
    assert moved("sqlite:////laptop/ws/mlflow.db", old, new) == "sqlite:////disk/ws/mlflow.db"
    assert moved("/laptop/ws/sweeps/s", old, new) == "/disk/ws/sweeps/s"
    for elsewhere in (
        "sqlite:////laptop/ws2/optuna.db",
        "/ckpt/s",
        "postgresql://me@db/optuna",
        "s3://bucket/s",
        "http://mlflow:5000",
    ):
        assert moved(elsewhere, old, new) == elsewhere


def test_a_copied_sweep_reads_its_stores_inside_the_copy_and_records_where_it_now_is(tmp_path):
    old, new = Workspace(tmp_path / "old"), Workspace(tmp_path / "new")
    written = state(
        backends=Backends(
            f"sqlite:///{old.root / 'mlflow.db'}", "postgresql://me@db/optuna", str(old.sweep_dir("lr-search"))
        )
    )
    old.write(written)
    (new.root / "sweeps").mkdir(parents=True)
    (old.root / "sweeps" / "lr-search").rename(new.root / "sweeps" / "lr-search")
    read = new.read("lr-search")
    assert read.backends == Backends(
        f"sqlite:///{new.root / 'mlflow.db'}", "postgresql://me@db/optuna", str(new.sweep_dir("lr-search"))
    )
    assert read.root == str(new.root)
    legacy = json.loads((new.sweep_dir("lr-search") / "sweep.json").read_text()) | {"root": None}
    (new.sweep_dir("lr-search") / "sweep.json").write_text(json.dumps(legacy))  # written before roots were recorded
    assert new.read("lr-search").backends == read.backends


def test_a_sweep_that_ran_and_whose_database_did_not_travel_is_refused_naming_it(tmp_path):
    ws = Workspace(tmp_path / "new")
    ws.write(state(backends=ws.default_backends("lr-search"), sessions=[SessionRecord(1.0, 7, None, "h")]))
    with pytest.raises(ConfigError, match=f"its MLflow database {ws.root / 'mlflow.db'} is missing"):
        ws.read("lr-search")
    assert listing(ws)[0].outcome == "unreadable"  # the others are still listed
    ws.write(state("fresh", backends=ws.default_backends("fresh")))  # created, its driver not yet run
    assert ws.read("fresh").sessions == []
