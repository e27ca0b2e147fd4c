"""`seqae sweep delete`: a sweep and everything it wrote go, from the workspace, Optuna, MLflow
(rows and artifacts), the queue and the data cache; another sweep's things stay as they were."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from seqae import Sweep
from sweeps.stores.workspace import DriverLock
from tests.sweep_helpers import in_process, run_args, seqae

# The columns by which a row of MLflow's or Optuna's tables belongs to one sweep.
MLFLOW_KEYS = ("run_uuid", "run_id", "experiment_id", "source_run_id", "destination_id")
OPTUNA_KEYS = ("study_id", "trial_id", "sweep")


def files(workspace: Path) -> dict[str, int]:
    """Every file of the workspace (its databases' own aside), with its size."""
    return {
        str(p.relative_to(workspace)): p.stat().st_size
        for p in workspace.rglob("*")
        if p.is_file() and not p.name.startswith(("mlflow.db", "optuna.db"))
    }


def rows(database: Path) -> dict[str, list[dict]]:
    """Every row of every table of a SQLite database, as column -> value."""
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.row_factory = sqlite3.Row
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: [dict(r) for r in db.execute(f'SELECT * FROM "{t}"')] for t in tables}  # noqa: S608 - names are SQLite's own


def counts(database: Path) -> dict[str, int]:
    return {t: len(r) for t, r in rows(database).items() if r}


def belongs(row: dict, ids: set[str]) -> bool:
    return any(str(row.get(k)) in ids for k in (*MLFLOW_KEYS, *OPTUNA_KEYS) if row.get(k) is not None)


def ids_of(workspace: Path, name: str) -> set[str]:
    """The ids by which the stores' rows name sweep ``name``: its experiment, runs, logged models,
    study and trials, and its name (the queue's key)."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL)
    models = client.search_logged_models(experiment_ids=[experiment.experiment_id])
    optuna_rows = rows(workspace / "optuna.db")
    study = next(r["study_id"] for r in optuna_rows["studies"] if r["study_name"] == name)
    trials = {str(r["trial_id"]) for r in optuna_rows["trials"] if r["study_id"] == study}
    return (
        {experiment.experiment_id, name, str(study)}
        | {r.info.run_id for r in runs}
        | {m.model_id for m in models}
        | trials
    )


def test_deleting_a_sweep_never_run_removes_its_folder_and_creates_no_store(tmp_path):
    """A sweep recorded and never run (`Sweep.create`) has only its folder (its sweep.json and its
    driver's lock): that goes, the dry run writes nothing, and no MLflow store is made by looking
    for its runs."""
    from tests.sweep_helpers import STUDIES, TINY

    workspace = tmp_path / "ws"
    Sweep.create(STUDIES / "quickstart.yaml", set=TINY, name="q", workspace=workspace)
    before = set(files(workspace))
    planned = Sweep("q", workspace).delete(dry_run=True)
    assert [(p.what, p.files) for p in planned.removed] == [("workspace folder", 1)] and set(files(workspace)) == before
    done = Sweep("q", workspace).delete()
    assert done.files == 1 and not (workspace / "sweeps" / "q").exists(), files(workspace)
    assert set(files(workspace)) == {f for f in before if not f.startswith("sweeps/q/")}
    assert not (workspace / "mlflow.db").exists()


@pytest.mark.slow
def test_delete_removes_every_file_and_row_of_the_sweep_and_nothing_of_another(tmp_path, monkeypatch):
    """Two tiny sweeps on one data set in one workspace (their cache entry shared): `delete --dry-run`
    changes nothing and lists what `delete` then removes, file for file; the first's delete leaves
    the shared cache entry, its registered model version (and the logged model it stands on) and
    every file and row of the second as they were, and no row naming the first; refused while its
    driver holds the sweep and for another user. The second's `delete --models` then leaves a
    workspace with no file and the stores with no row of either."""
    workspace = tmp_path / "ws"
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    for name in ("first", "second"):
        ran = seqae(*run_args(workspace, name, "trials.total=1", "train.epochs=1"))
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    ws = ["--workspace", str(workspace)]
    first_ids, second_ids = ids_of(workspace, "first"), ids_of(workspace, "second")
    before = files(workspace), rows(workspace / "mlflow.db"), rows(workspace / "optuna.db")
    print(
        "before:",
        len(before[0]),
        "files;",
        "mlflow",
        counts(workspace / "mlflow.db"),
        "optuna",
        counts(workspace / "optuna.db"),
    )

    with DriverLock(workspace / "sweeps" / "first" / "driver.lock"):  # as a running driver holds it
        refused = in_process(["sweep", "delete", "first", *ws], 60)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    print(refused.stderr)
    assert "sweep 'first' is running (pid" in refused.stderr and "seqae sweep stop first --now" in refused.stderr
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    refused = in_process(["sweep", "delete", "first", *ws], 60)
    assert refused.returncode == 2 and "belongs to alice; bob may not delete it" in refused.stderr, refused.stderr
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")

    dry = in_process(["sweep", "delete", "first", "--dry-run", *ws], 120)
    assert dry.returncode == 0, dry.stderr
    print(dry.stdout)
    assert (files(workspace), rows(workspace / "mlflow.db"), rows(workspace / "optuna.db")) == before
    planned = Sweep("first", workspace).delete(dry_run=True)

    done = in_process(["sweep", "delete", "first", *ws], 120)
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    after = files(workspace), rows(workspace / "mlflow.db"), rows(workspace / "optuna.db")
    print(
        "after first:",
        len(after[0]),
        "files;",
        "mlflow",
        counts(workspace / "mlflow.db"),
        "optuna",
        counts(workspace / "optuna.db"),
    )
    gone = before[0].keys() - after[0].keys()
    assert not after[0].keys() - before[0].keys() and all(after[0][f] == before[0][f] for f in after[0])
    assert len(gone) == planned.files and sum(before[0][f] for f in gone) == planned.bytes
    assert {f.split("/")[0] for f in gone} == {"sweeps", "mlartifacts"}  # the cache entry is the second's too
    assert not any(f.startswith("sweeps/first/") for f in after[0])
    kept = [p for p in planned.kept if p.what == "registered model versions"]
    assert (
        kept
        and kept[0].files
        and all(f.startswith("mlartifacts/first/models/") for f in after[0] if f.startswith("mlartifacts/first/"))
    )
    for database, before_rows in (("mlflow.db", before[1]), ("optuna.db", before[2])):
        now = rows(workspace / database)
        for table, old in before_rows.items():
            mine = [r for r in old if belongs(r, second_ids)]
            assert [r for r in now[table] if belongs(r, second_ids)] == mine, (database, table)
            left = [r for r in now[table] if belongs(r, first_ids)]
            # what stays of the first: its registered version, its logged model and their experiment
            if database == "optuna.db" or table not in (
                "experiments",
                "experiment_tags",
                "datasets",
                "logged_models",
                "logged_model_tags",
                "logged_model_params",
                "logged_model_metrics",
                "model_versions",
            ):
                assert not left, (database, table, left[:2])
    assert Sweep("second", workspace).status().best
    with pytest.raises(Exception, match="no sweep named 'first'"):
        Sweep("first", workspace)

    done = in_process(["sweep", "delete", "second", "--models", *ws], 120)
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    print(
        "after second --models:",
        len(files(workspace)),
        "files;",
        "mlflow",
        counts(workspace / "mlflow.db"),
        "optuna",
        counts(workspace / "optuna.db"),
    )
    left = files(
        workspace
    )  # the first's kept model, and the workspace's own lock (`sweep run` takes it to create any sweep)
    assert all(f.startswith(("mlartifacts/first/models/", ".create.lock")) for f in left), sorted(left)[:5]
    for database in ("mlflow.db", "optuna.db"):
        for table, now in rows(workspace / database).items():
            assert not [r for r in now if belongs(r, second_ids)], (database, table)
    assert not [r for r in rows(workspace / "optuna.db")["trials"]]
    assert not list((workspace / "cache").iterdir()), list((workspace / "cache").iterdir())
