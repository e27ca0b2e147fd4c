"""`seqae sweep export` (sweeps/results/export.py): every trial as one table, on a real Optuna study
(SQLite), real checkpoint records and a real MLflow store in a workspace; no training."""

from __future__ import annotations

import pandas as pd
import pytest

from seqae_core import metrics as M
from seqae_errors import ConfigError
from sweeps.results.export import FORMATS, export, trial_table
from sweeps.stores.tracking import Tracker
from tests.sweep_helpers import seqae
from tests.test_status import quickstart, run_trials, start_sweep, template, workspace, write_sweep  # noqa: F401


def test_the_table_has_a_row_per_trial_with_its_kept_epoch_cost_and_run(workspace):  # noqa: F811
    spec = quickstart("resources.cpu=2")
    state = write_sweep(workspace, "qs", spec)
    study = start_sweep(workspace, state)
    storage = state.backends.storage
    numbers = run_trials(study, storage, [([10.0, 20.0], 0.6, True), ([5.0], 0.3, False), ([], 0.0, None)])
    tracker = Tracker(state.backends.mlflow_tracking_uri, "qs", storage, workspace.artifact_root, spec.share)
    tracker.open(state.fingerprint, None, None, {}, (M.VAL_TOKEN_ACCURACY, "max"))
    state.mlflow_experiment_id = tracker.experiment_id
    workspace.write(state)
    run_ids = {n: tracker.child_run(n, study.trial_spec(n).logged_params) for n in numbers}

    table = trial_table(workspace, "qs")

    assert list(table.trial) == numbers
    assert list(table.state) == ["COMPLETE", "PRUNED", "RUNNING"]
    assert list(table.outcome) == ["complete", "pruned", "interrupted"]
    assert list(table.start) == ["paper_lr", "", ""] and table.proposed_by[0] == "start"
    assert table["param.train.lr"][0] == 1.0e-3 and {"param.model.d_model", "param.model.d_attn"} <= set(table)
    assert list(table.kept_epoch.fillna(0)) == [1, 1, 0] and list(table.last_epoch.fillna(0)) == [2, 1, 0]
    assert table[M.VAL_TOKEN_ACCURACY][0] == 0.6
    assert list(table.cost_seconds) == [60.0, 10.0, 0.0]  # two CPUs held
    assert list(table.mlflow_run_id) == [run_ids[n] for n in numbers]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_reads_back_with_pandas(workspace, tmp_path, fmt):  # noqa: F811
    """Each format, named by --format or only by the suffix, into a folder that did not exist."""
    spec = quickstart()
    state = write_sweep(workspace, "qs", spec)
    run_trials(start_sweep(workspace, state), state.backends.storage, [([10.0], 0.5, True), ([10.0], 0.4, True)])
    path = export(workspace, "qs", fmt, str(tmp_path / "new" / f"t{FORMATS[fmt]}"))
    assert export(workspace, "qs", None, str(tmp_path / f"u{FORMATS[fmt]}")).read_bytes() == path.read_bytes()
    read = {"csv": pd.read_csv, "parquet": pd.read_parquet, "jsonl": lambda p: pd.read_json(p, lines=True)}[fmt]
    back = read(path)
    assert list(back.trial) == [0, 1] and list(back[M.VAL_TOKEN_ACCURACY]) == [0.5, 0.4]


def test_bad_input_is_one_line_and_writes_nothing(workspace, tmp_path):  # noqa: F811
    write_sweep(workspace, "qs", quickstart())
    taken = tmp_path / "mine.csv"
    taken.write_text("a user's file")
    for name, fmt, out, says in (
        ("qs", "xlsx", None, "--format='xlsx': choose from csv, parquet, jsonl"),
        ("qs", "csv", str(taken), "the file exists"),
        ("nope", "csv", str(tmp_path / "n.csv"), "no sweep named 'nope'"),
    ):
        with pytest.raises(ConfigError, match=says):
            export(workspace, name, fmt, out)
    with pytest.raises(ConfigError, match="--format=parquet but --out=.*x.csv names csv"):
        export(workspace, "qs", "parquet", str(tmp_path / "x.csv"))
    assert taken.read_text() == "a user's file" and not (tmp_path / "n.csv").exists()
    assert not (tmp_path / "x.csv").exists()
    with pytest.raises(ConfigError, match="cannot write it"):  # a folder that cannot be: a file is in the way
        export(workspace, "qs", None, str(taken / "x.csv"))
    run = seqae("sweep", "export", "nope", "--workspace", str(workspace.root), "--out", str(tmp_path / "n.csv"))
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "no sweep named 'nope'" in run.stderr, run.stderr


def test_a_trial_outside_a_constraint_is_never_the_best_and_export_says_which(workspace):  # noqa: F811
    """A bound on the objective's own metric, so the epoch records need nothing else: the most
    accurate trial breaks ``val_token_accuracy <= 0.55`` and the best is the next one."""
    spec = quickstart(
        "constraints=[{metric: val_token_accuracy, at_most: 0.55}]", "sampler={type: tpe, seed: 0}"
    )  # the quickstart's random search models no constraint
    state = write_sweep(workspace, "qs", spec)
    study = start_sweep(workspace, state)
    numbers = run_trials(
        study, state.backends.storage, [([10.0], 0.6, True), ([10.0], 0.5, True), ([10.0], 0.4, True), ([], 0.0, None)]
    )
    assert [t.number for t in study.best()] == [numbers[1]]
    assert [t.number for t in study.ranked()] == numbers[1:3]
    assert list(trial_table(workspace, "qs").feasible) == [False, True, True, None]


def test_the_report_scores_each_trial_on_its_kept_checkpoints_test_pages_as_export_does(workspace):  # noqa: F811
    """A trial whose validation peaked at epoch 1 of 2: its MLflow run's latest test score is epoch
    2's, but the report's table and claims, like export and status, take the kept epoch's."""
    import torch

    from dashboards.report import data
    from seqae_core.checkpoint import CheckpointStore
    from sweeps.results.trials import read_trials
    from sweeps.stores.ledger import decide, settle
    from sweeps.stores.search import read_only
    from tests.test_status import new_trial

    spec = quickstart()
    state = write_sweep(workspace, "qs", spec)
    study = start_sweep(workspace, state)
    storage = state.backends.storage
    number = new_trial(study)
    history = [
        {M.EPOCH: 1, M.VAL_TOKEN_ACCURACY: 0.7, M.TEST_TOKEN_ACCURACY: 0.68, M.EPOCH_SECONDS: 10.0},
        {M.EPOCH: 2, M.VAL_TOKEN_ACCURACY: 0.6, M.TEST_TOKEN_ACCURACY: 0.5, M.EPOCH_SECONDS: 10.0},
    ]
    store = CheckpointStore.of_trial(storage, number)
    for epoch in (1, 2):
        store.save_epoch(
            epoch,
            {"epoch": epoch, "weight": torch.zeros(2)},
            {"history": history[:epoch], "finished": epoch == 2, "patience_spent": False},
        )
    progress = store.progress()
    outcome = decide(progress, error=False)
    settle(study, number, outcome, progress)
    tracker = Tracker(state.backends.mlflow_tracking_uri, "qs", storage, workspace.artifact_root, spec.share)
    tracker.open(state.fingerprint, None, None, {}, (M.VAL_TOKEN_ACCURACY, "max"))
    tracker.child_run(number, study.trial_spec(number).logged_params)
    tracker.trial_ended(number, outcome)  # the run made whole from the records: both epochs' metrics

    records = {t.number: t for t in read_trials(spec, read_only(spec, state.backends.optuna_storage, "qs"), storage)}
    _, (shown,) = data.collect(state.backends.mlflow_tracking_uri, tracker.experiment_id, records)

    assert tracker.client.get_run(shown.run_id).data.metrics[M.TEST_TOKEN_ACCURACY] == 0.5  # the run's latest
    assert (shown.kept_epoch, shown.test, shown.cost, shown.start) == (1, 0.68, 20.0, "paper_lr")
    assert trial_table(workspace, "qs")[M.TEST_TOKEN_ACCURACY].tolist() == [0.68]
