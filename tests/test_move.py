"""A workspace is a folder that can move: a finished sweep's workspace, moved to another folder,
answers `status`, `export`, `report`, `resume`, `encode` and `seqae ui` from there, and nothing
appears at the folder it left; a copy of its records without its databases is refused."""

from __future__ import annotations

import shutil
import signal
import urllib.request

import pandas as pd
import pytest

from tests.refusal import assert_refused
from tests.sweep_helpers import run_args, seqae, start_ui, status, stop_ui

pytestmark = pytest.mark.slow


def test_a_moved_workspace_answers_from_its_new_folder_and_nothing_appears_at_the_old(tmp_path):
    old, new = tmp_path / "laptop" / "ws", tmp_path / "bigger-disk" / "ws"
    # run in a process of its own, as on the laptop: this process's MLflow would otherwise keep the
    # runs' artifact locations it used (its cache, by run id) past the move
    run = seqae(*run_args(old, "moving", "trials.total=2", "train.epochs=1"), fresh=True)
    assert run.returncode == 0, run.stdout[-3000:]
    before = status("moving", old)
    new.parent.mkdir()
    shutil.move(old, new)
    (tmp_path / "laptop").rmdir()
    ws = ["--workspace", str(new)]

    after = status("moving", new)
    assert after["trials_by_state"] == before["trials_by_state"] == {"COMPLETE": 2}
    assert after["best"] == before["best"]
    for store in ("mlflow_tracking_uri", "optuna_storage", "storage"):
        assert str(new) in after[store] and str(old) not in after[store], after[store]

    exported = seqae("sweep", "export", "moving", "--out", str(tmp_path / "trials.csv"), *ws)
    assert exported.returncode == 0, exported.stderr
    assert len(pd.read_csv(tmp_path / "trials.csv")) == 2
    report = seqae("report", "moving", *ws)
    assert report.returncode == 0, report.stderr
    assert (new / "sweeps" / "moving" / "report" / "index.html").exists()
    resumed = seqae("sweep", "resume", "moving", *ws)
    assert resumed.returncode == 0 and "the best model is still" in resumed.stdout, resumed.stdout[-3000:]
    encoded = seqae("encode", "moving", "a short text to reconstruct", *ws)  # the registered model's files
    assert encoded.returncode == 0 and "token accuracy" in encoded.stdout, encoded.stderr

    ui, mlflow_port, optuna_port = start_ui(new, tmp_path / "ui.log")
    try:  # the UI serves the sweep run's report from the new folder
        query = f"path=report/index.html&run_uuid={after['mlflow_parent_run_id']}"
        with urllib.request.urlopen(f"http://127.0.0.1:{mlflow_port}/get-artifact?{query}", timeout=60) as page:
            assert b"moving" in page.read()
    finally:
        stop_ui(ui, signal.SIGTERM, tmp_path / "ui.log", (mlflow_port, optuna_port))  # a process manager's stop
    assert not (tmp_path / "laptop").exists()  # no verb wrote, or created a database, at the old folder

    # Only the sweeps' records travelled, their databases did not: refused in one line, nothing created.
    half = tmp_path / "records-only" / "ws"
    shutil.copytree(new / "sweeps", half / "sweeps")
    for verb in (
        ["sweep", "status", "moving"],
        ["sweep", "export", "moving", "--out", str(tmp_path / "t.csv")],
        ["report", "moving"],
    ):
        refused = seqae(*verb, "--workspace", str(half))
        assert_refused(
            refused.returncode,
            refused.stderr,
            f"its MLflow database {half / 'mlflow.db'} is missing",
            created=(half / "mlflow.db", half / "optuna.db", tmp_path / "t.csv"),
        )
