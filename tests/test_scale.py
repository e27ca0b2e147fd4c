"""The control plane as sweeps grow (``seqae bench control-plane`` measures it): every MLflow run
is read however many there are, a driver's start reads each trial of the study once, and the
report of a large sweep summarizes its trials instead of drawing a line for each, reading only
what it draws. On real stores (Optuna and MLflow on SQLite in ``tmp_path``), with the page sizes
made small so that a few runs take several pages. No Ray and no training."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from benchmarks import control_plane
from dashboards.report import data, figures, optuna_plots, page
from sweeps.results.export import trial_table
from sweeps.spec import sweep as spec_lib
from sweeps.stores.search import open_study
from sweeps.stores.search import storage as optuna_storage
from sweeps.stores.tracking import Tracker
from sweeps.stores.workspace import Workspace
from tests.sweep_helpers import STUDIES

SPEC = spec_lib.load(STUDIES / "quickstart.yaml", ["trials.total=30"])


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Empty MLflow and Optuna databases with their tables created, which each test copies."""
    folder = tmp_path_factory.mktemp("templates")
    MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
    optuna_storage(f"sqlite:///{folder / 'optuna.db'}")
    return folder


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A finished sweep of 8 trials, as the benchmark builds it (``control_plane.build``)."""
    return control_plane.build(tmp_path_factory.mktemp("scale") / "ws", 8)


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """A search returns at most three runs, whatever ``max_results`` asks (MLflow caps a page at
    50,000): a sweep of 8 trials (9 runs) takes three pages."""
    search = MlflowClient.search_runs

    def capped(self, experiment_ids, filter_string="", run_view_type=1, max_results=1000, *args, **kwargs):  # noqa: ANN001, ANN202
        return search(self, experiment_ids, filter_string, run_view_type, min(max_results, 3), *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "search_runs", capped)


# -- the benchmark's own measurement -------------------------------------------------------------


@pytest.mark.slow
def test_the_benchmark_times_every_command_with_each_code_on_the_same_sweeps():
    """``--before`` times the commands again with another checkout first on the path (here this
    one: the point is that both run, the driver's start twice on the same sweep)."""
    rows = control_plane.run([4], ["sqlite"], before=control_plane.REPO)
    commands = ["status", "status --json", "sweep list", "export", "report", "driver start"]
    assert [(r["code"], r["command"]) for r in rows] == [(c, m) for c in ("after", "before") for m in commands]
    assert all(r["trials"] == 4 and r["wall_s"] > 0 and r["cpu_s"] > 0 and r["peak_mib"] > 0 for r in rows)
    assert all(0 < r["start_s"] < r["wall_s"] for r in rows if r["command"] == "driver start")


# -- every run, a page at a time ----------------------------------------------------------------
def test_every_run_is_read_when_they_take_several_pages(sweep, small_pages):
    state = sweep.read(control_plane.NAME)
    client = MlflowClient(state.backends.mlflow_tracking_uri)
    assert len(client.search_runs([state.mlflow_experiment_id], max_results=10_000)) == 3  # one page

    tracker = Tracker(state.backends.mlflow_tracking_uri, control_plane.NAME, state.backends.storage)
    tracker.experiment_id = state.mlflow_experiment_id
    assert sorted(tracker.trial_runs()) == list(range(8))
    table = trial_table(sweep, control_plane.NAME)
    assert len(table) == 8 and (table.mlflow_run_id != "").all()
    parent, trials = data.collect(state.backends.mlflow_tracking_uri, state.mlflow_experiment_id)
    assert parent is not None and [t.number for t in trials] == list(range(8))


# -- a driver's start reads the study once -------------------------------------------------------
def test_a_driver_start_reads_each_trial_of_the_study_once(tmp_path, templates, monkeypatch):
    """Optuna's cache of finished trials (``_CachedStorage``, which Optuna puts around an
    ``RDBStorage``) keeps the study's many reads during a start to one: a storage Optuna does
    not recognise as an ``RDBStorage`` would read every trial at each of them."""
    shutil.copy(templates / "optuna.db", tmp_path / "optuna.db")
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = open_study(SPEC, url, "s", 20, SPEC.fingerprint())
    dists = {k: optuna.distributions.FloatDistribution(3e-4, 3e-3, log=True) for k in ["train.lr"]}
    first.study.add_trials(
        [
            optuna.trial.create_trial(
                state=TrialState.COMPLETE, params={"train.lr": 1e-3}, distributions=dists, values=[0.1 * n]
            )
            for n in range(20)
        ]
    )
    read: collections.Counter[str] = collections.Counter()
    original = optuna.storages.RDBStorage._get_trials

    def counted(self, *args, **kwargs):  # noqa: ANN001, ANN202 - Optuna's private signature
        trials = original(self, *args, **kwargs)
        read.update(str(t.number) for t in trials)
        return trials

    monkeypatch.setattr(optuna.storages.RDBStorage, "_get_trials", counted)
    study = open_study(SPEC, url, "s", 21, SPEC.fingerprint())  # what a driver does before its first trial:
    study.start_waiting()
    study.numbers(TrialState.RUNNING)
    study.trials()
    study.remaining()
    assert study.next_trial() is not None
    assert {n: c for n, c in read.items() if int(n) < 20} == {str(n): 1 for n in range(20)}


# -- the report of a large sweep -----------------------------------------------------------------
def test_a_large_sweeps_report_summarizes_and_reads_only_what_it_draws(sweep, tmp_path, monkeypatch):
    """Above MANY trials: a summary figure of every trial, the loss curves of the DRAWN best only
    (their histories the only ones read besides validation accuracy), the samples of the trial shown."""
    monkeypatch.setattr(figures, "MANY", 5)
    monkeypatch.setattr(figures, "DRAWN", 3)
    histories: collections.Counter[str] = collections.Counter()
    downloads: list[str] = []
    get_history, download = MlflowClient.get_metric_history, MlflowClient.download_artifacts

    def counted_history(self, run_id, key):  # noqa: ANN001, ANN202
        histories[key] += 1
        return get_history(self, run_id, key)

    def counted_download(self, run_id, *args, **kwargs):  # noqa: ANN001, ANN202
        downloads.append(run_id)
        return download(self, run_id, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "get_metric_history", counted_history)
    monkeypatch.setattr(MlflowClient, "download_artifacts", counted_download)
    state = sweep.read(control_plane.NAME)

    index = page.build(state, tmp_path / "report", log_to_mlflow=False)

    read = dict(histories)
    _, trials = data.collect(state.backends.mlflow_tracking_uri, state.mlflow_experiment_id)
    assert read["val_token_accuracy"] == sum(bool(t.accuracy) for t in trials)  # each trial's, once
    assert read["train_loss"] == 3 and read["val_loss"] == 3  # the drawn trials' only
    assert len(downloads) == 1  # one latent ratio: its best trial's samples
    html = index.read_text()
    assert "summary.png" in html and "of the 3 best trials (of 8)" in html
    assert 'id="trial-search"' in html and html.count("<tr class=") >= 8  # every row; the script pages them
    assert {p.name for p in (tmp_path / "report").glob("*.png")} >= {"summary.png", "losses.png"}


def test_a_small_sweeps_report_draws_every_trial(sweep, tmp_path):
    state = sweep.read(control_plane.NAME)
    _, trials = data.collect(state.backends.mlflow_tracking_uri, state.mlflow_experiment_id)
    assert figures.drawn(trials) == trials and figures.summary_figure(trials, tmp_path) is None


def test_parallel_coordinates_of_a_large_study_draw_its_best_trials(tmp_path):
    study = optuna.create_study(direction="maximize")
    dists = {"x": optuna.distributions.FloatDistribution(0, 1)}
    study.add_trials(
        [
            optuna.trial.create_trial(params={"x": n / 100}, distributions=dists, values=[n / 100])
            for n in range(figures.MANY + 10)
        ]
    )
    best = optuna_plots.best_of(study)
    assert sorted(t.values[0] for t in best.trials) == [n / 100 for n in range(10, figures.MANY + 10)]
    assert optuna_plots.best_of(best) is best
