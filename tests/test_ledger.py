"""sweeps/stores/ledger.py: how a trial ended (``Outcome``, ``decide``), recording it in the study
(``settle``), what it cost (``resource_seconds``), and what a new driver repairs after a crash
(``reconcile_study``, ``reconcile_runs``), on a real Optuna study, a real MLflow store (both SQLite in ``tmp_path``) and
checkpoint records written through ``CheckpointStore``. No Ray and no training."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from seqae_core import metrics as M
from seqae_core.checkpoint import CheckpointStore
from seqae_core.records import TrialProgress
from sweeps.spec import sweep as spec_lib
from sweeps.stores.ledger import Outcome, decide, reconcile_runs, reconcile_study, resource_seconds, settle
from sweeps.stores.search import SweepStudy, open_study
from sweeps.stores.search import storage as optuna_storage
from sweeps.stores.tracking import Tracker
from tests.conftest import WIKI_MINI, epoch_record
from tests.sweep_helpers import STUDIES

NAME = "ledger"
SPEC = spec_lib.load(STUDIES / "quickstart.yaml", [f"data.path={WIKI_MINI}", "trials.total=6"])


def history(accuracies: list[float], seconds: float = 10.0) -> list[dict]:
    """Epoch metrics as ``seqae_core.train`` reports them (the keys the ledger and tracker read)."""
    return [
        {M.EPOCH: epoch, M.VAL_TOKEN_ACCURACY: acc, M.VAL_LOSS: 1.0 - acc, M.EPOCH_SECONDS: seconds}
        for epoch, acc in enumerate(accuracies, 1)
    ]


def write_records(
    storage: str, number: int, epochs: list[dict], finished: bool, patience_spent: bool = False
) -> CheckpointStore:
    """Trial ``number``'s epoch records, one per epoch, as training saves them; the last one says
    whether the run finished."""
    store = CheckpointStore.of_trial(storage, number)
    for record in epochs:
        epoch, last = record[M.EPOCH], record is epochs[-1]
        store.save_epoch(
            epoch,
            {"epoch": epoch, "weight": torch.full((2,), float(epoch))},
            {"history": epochs[:epoch], "finished": finished and last, "patience_spent": patience_spent and last},
        )
    return store


def new_study(tmp_path: Path) -> SweepStudy:
    """The sweep's study as a driver opens it (again, after a crash)."""
    return open_study(SPEC, f"sqlite:///{tmp_path}/optuna.db", NAME, SPEC.planned_trials(), SPEC.fingerprint())


def new_tracker(tmp_path: Path, storage: str) -> Tracker:
    """The sweep's MLflow side as a driver opens it: a fresh tracker that knows no run yet."""
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", NAME, storage, tmp_path / "mlartifacts", SPEC.share)
    tracker.open(SPEC.fingerprint(), None, None, {"sweep.file": "quickstart.yaml"}, (M.VAL_TOKEN_ACCURACY, "max"))
    return tracker


def new_trial(study: SweepStudy) -> int:
    """Ask the study for its next trial, as a driver does; returns its number."""
    trial = study.next_trial()
    assert trial is not None, "the study planned no more trials"
    return trial.number


def states(study: SweepStudy) -> dict[int, str]:
    return {t.number: t.state.name for t in study.trials()}


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Empty MLflow and Optuna databases with their tables created: creating them takes seconds on
    SQLite, so each test starts from copies of these."""
    folder = tmp_path_factory.mktemp("templates")
    MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
    optuna_storage(f"sqlite:///{folder / 'optuna.db'}")
    return folder


@pytest.fixture
def storage(tmp_path: Path, templates: Path) -> str:
    """The sweep's checkpoint storage; ``tmp_path`` also gets the (empty) Optuna and MLflow databases."""
    for database in ("mlflow.db", "optuna.db"):
        shutil.copy(templates / database, tmp_path / database)
    return str(tmp_path / "storage")


# -- Outcome ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "outcome, optuna_state, mlflow_status",
    [
        pytest.param(Outcome.COMPLETE, TrialState.COMPLETE, "FINISHED", id="complete"),
        pytest.param(Outcome.PRUNED, TrialState.PRUNED, "FINISHED", id="pruned"),
        pytest.param(Outcome.FAIL, TrialState.FAIL, "FAILED", id="fail"),
        pytest.param(Outcome.RUNNING, TrialState.RUNNING, "KILLED", id="running"),
    ],
)
def test_each_outcome_maps_to_an_optuna_state_and_an_mlflow_status(outcome, optuna_state, mlflow_status):
    assert outcome.optuna_state is optuna_state
    assert outcome.mlflow_status == mlflow_status


# -- decide -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "epochs_run, finished, patience_spent, error, limit, expected",
    [
        pytest.param(2, True, False, True, None, Outcome.FAIL, id="error-beats-finished-records"),
        pytest.param(3, True, False, False, None, Outcome.COMPLETE, id="finished"),
        pytest.param(2, True, True, False, None, Outcome.COMPLETE, id="patience-spent"),
        pytest.param(1, False, False, False, None, Outcome.PRUNED, id="stopped-by-the-scheduler"),
        pytest.param(3, True, False, False, 5, Outcome.PRUNED, id="extended-limit-not-reached"),
        pytest.param(5, True, False, False, 5, Outcome.COMPLETE, id="extended-limit-reached"),
        pytest.param(3, True, True, False, 5, Outcome.COMPLETE, id="extended-patience-spent"),
        pytest.param(4, False, False, False, 5, Outcome.PRUNED, id="extended-stopped-by-the-scheduler"),
    ],
)
def test_decide_reads_the_outcome_from_the_records(
    tmp_path, epochs_run, finished, patience_spent, error, limit, expected
):
    epochs = history([0.1 * e for e in range(1, epochs_run + 1)])
    progress = write_records(str(tmp_path), 0, epochs, finished, patience_spent).progress()
    assert progress is not None and progress.epoch == epochs_run and progress.history == epochs
    assert decide(progress, error, limit) is expected


def test_a_trial_the_budget_stopped_is_complete_with_the_epoch_it_kept(tmp_path):
    """Nothing ranked it below another trial, so it competes for the best (a rung's stop prunes)."""
    progress = write_records(str(tmp_path), 0, history([0.5, 0.7]), False, False).progress()
    assert decide(progress, False, None, budget_stopped=True) is Outcome.COMPLETE
    assert decide(progress, False, None) is Outcome.PRUNED
    assert decide(progress, True, None, budget_stopped=True) is Outcome.FAIL


def test_a_trial_stop_now_halted_is_left_to_continue_unless_it_had_finished(tmp_path):
    """`seqae sweep stop --now` stops a trial at an epoch's end: the next session continues it."""
    progress = write_records(str(tmp_path), 0, history([0.5, 0.7]), False, False).progress()
    assert decide(progress, False, None, halted=True) is Outcome.RUNNING
    assert decide(progress, True, None, halted=True) is Outcome.FAIL
    done = write_records(str(tmp_path), 1, history([0.5, 0.7]), True, False).progress()
    assert decide(done, False, None, halted=True) is Outcome.COMPLETE  # stopped on its last epoch


def test_decide_fails_a_trial_without_records_or_without_an_epoch(tmp_path):
    assert CheckpointStore.of_trial(str(tmp_path), 0).progress() is None
    assert decide(None, error=False) is Outcome.FAIL
    store = CheckpointStore.of_trial(str(tmp_path), 1)
    store.save_epoch(1, {"epoch": 1}, {"history": [], "finished": True, "patience_spent": False})
    empty = store.progress()
    assert empty is not None and empty.finished and empty.history == []
    assert decide(empty, error=False) is Outcome.FAIL


# -- settle -----------------------------------------------------------------------------------
def test_settle_complete_records_the_best_epochs_value_and_every_epochs_value(tmp_path, storage):
    study = new_study(tmp_path)
    number = new_trial(study)
    progress = write_records(storage, number, history([0.4, 0.7, 0.6]), finished=True).progress()
    settle(study, number, Outcome.COMPLETE, progress)
    [trial] = new_study(tmp_path).trials()
    assert trial.state == TrialState.COMPLETE
    assert trial.values == [0.7]  # the epoch early stopping kept, not the last one
    assert trial.intermediate_values == {1: 0.4, 2: 0.7, 3: 0.6}


@pytest.mark.parametrize(
    "outcome, state",
    [
        pytest.param(Outcome.PRUNED, TrialState.PRUNED, id="pruned"),
        pytest.param(Outcome.FAIL, TrialState.FAIL, id="fail"),
        pytest.param(Outcome.RUNNING, TrialState.RUNNING, id="running-changes-nothing"),
    ],
)
def test_settle_without_values_sets_the_state(tmp_path, storage, outcome, state):
    study = new_study(tmp_path)
    number = new_trial(study)
    settle(study, number, outcome, None)
    [trial] = new_study(tmp_path).trials()
    assert trial.state == state
    assert trial.values is None


@pytest.mark.parametrize("first", [Outcome.COMPLETE, Outcome.PRUNED, Outcome.FAIL], ids=lambda o: o.value.lower())
def test_a_second_settle_of_a_finished_trial_changes_nothing(tmp_path, storage, first):
    study = new_study(tmp_path)
    number = new_trial(study)
    settle(study, number, first, write_records(storage, number, history([0.3, 0.5]), finished=True).progress())
    before = new_study(tmp_path).trials()[0]
    assert before.state == first.optuna_state
    later = TrialProgress(3, history([0.9, 0.95, 0.99]), finished=True)  # records that would give another value
    for outcome in Outcome:
        settle(study, number, outcome, later)
    [after] = new_study(tmp_path).trials()
    assert (after.state, after.values, after.intermediate_values) == (
        before.state,
        before.values,
        before.intermediate_values,
    )
    assert after.values == ([0.5] if first is Outcome.COMPLETE else None)


# -- resource_seconds -------------------------------------------------------------------------
def test_resource_seconds_is_the_share_times_every_epochs_seconds(tmp_path):
    epochs = [{**record, M.EPOCH_SECONDS: seconds} for record, seconds in zip(history([0.1, 0.2, 0.3]), (1.5, 2.5, 4))]
    progress = write_records(str(tmp_path), 0, epochs, finished=True).progress()
    assert resource_seconds(2.0, progress) == pytest.approx(16.0)
    assert resource_seconds(0.25, progress) == pytest.approx(2.0)  # a quarter of a GPU
    assert resource_seconds(2.0, None) == 0.0


# -- reconcile --------------------------------------------------------------------------------
def reconcile(study: SweepStudy, storage: str, tracker: Tracker, lift_drain: bool = True) -> list[str]:
    """What a starting driver does: the study first, then MLflow's runs."""
    return [*reconcile_study(study, storage, lift_drain), *reconcile_runs(study, tracker)]


def test_reconcile_after_a_driver_died_mid_sweep(tmp_path, storage):
    """Trial 0 finished training while no driver ran; trial 1 was interrupted; trial 2 failed and
    trial 3 was pruned, but their runs stayed RUNNING or have another status; trial 4 was pruned
    while MLflow was out, so it has no run."""
    study = new_study(tmp_path)
    dead = new_tracker(tmp_path, storage)  # the driver that died
    numbers = [new_trial(study) for _ in range(5)]
    assert numbers == [0, 1, 2, 3, 4]
    params = {n: study.trial_spec(n).logged_params for n in numbers}
    write_records(storage, 0, history([0.5, 0.8, 0.7]), finished=True)
    write_records(storage, 1, history([0.4]), finished=False)
    write_records(storage, 4, history([0.2], seconds=30.0), finished=False)
    for n in (1, 2, 3):
        dead.open_run(n, params[n])
    study.tell(2, TrialState.FAIL)
    study.tell(3, TrialState.PRUNED)
    dead.trial_ended(3, Outcome.COMPLETE)  # a status that is not its trial's
    study.tell(4, TrialState.PRUNED)

    notes = reconcile(new_study(tmp_path), storage, new_tracker(tmp_path, storage))

    assert sorted(notes) == sorted(
        [
            "trial 0: had finished training; recorded as complete",
            "trial 1: was interrupted; it will continue from its checkpoint",
            "MLflow run of trial 1 closed as KILLED (interrupted, until the trial continues)",
            "MLflow run of trial 2 closed as FAILED (failed)",
            "MLflow run of trial 3 closed as FINISHED (pruned)",
            "MLflow run of trial 0 rebuilt from its records, as FINISHED (complete)",
            "MLflow run of trial 4 rebuilt from its records, as FINISHED (pruned)",
        ]
    )
    study = new_study(tmp_path)
    assert states(study) == {0: "COMPLETE", 1: "RUNNING", 2: "FAIL", 3: "PRUNED", 4: "PRUNED"}
    assert study.trials()[0].values == [0.8]
    runs = new_tracker(tmp_path, storage).trial_runs()
    assert {n: (r.info.status, r.data.tags["seqae.outcome"]) for n, r in runs.items()} == {
        0: ("FINISHED", "complete"),
        1: ("KILLED", "interrupted"),
        2: ("FAILED", "failed"),
        3: ("FINISHED", "pruned"),
        4: ("FINISHED", "pruned"),
    }
    assert {n: r.info.run_name for n, r in runs.items() if r.info.run_name.endswith("-pruned")} == {
        3: "trial-0003-pruned",
        4: "trial-0004-pruned",
    }  # told apart at a glance
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    for n, accuracies, cost in ((0, [0.5, 0.8, 0.7], 30.0), (4, [0.2], 30.0)):  # rebuilt from the records
        run = runs[n]
        assert run.data.params == {k: "null" if v is None else str(v) for k, v in params[n].items()}
        assert [m.value for m in client.get_metric_history(run.info.run_id, M.VAL_TOKEN_ACCURACY)] == accuracies
        assert run.data.metrics[M.RESOURCE_SECONDS] == pytest.approx(SPEC.share[1] * cost)

    # A second driver finds nothing left to repair, and says again that trial 1 continues.
    again = reconcile(new_study(tmp_path), storage, new_tracker(tmp_path, storage))
    assert again == ["trial 1: was interrupted; it will continue from its checkpoint"]


def test_reconcile_logs_the_parameters_of_a_run_created_without_them(tmp_path, storage):
    study = new_study(tmp_path)
    number = new_trial(study)
    new_tracker(tmp_path, storage).child_run(number, {})  # killed between creating the run and logging its params
    [bare] = new_tracker(tmp_path, storage).trial_runs().values()
    assert bare.data.params == {} and bare.info.status == "RUNNING"

    notes = reconcile(new_study(tmp_path), storage, new_tracker(tmp_path, storage))

    assert sorted(notes) == sorted(
        [
            f"trial {number}: was interrupted; it will continue from its checkpoint",
            f"MLflow run of trial {number}: its parameters logged",
            f"MLflow run of trial {number} closed as KILLED (interrupted, until the trial continues)",
        ]
    )
    [run] = new_tracker(tmp_path, storage).trial_runs().values()
    logged = study.trial_spec(number).logged_params
    assert "train.lr" in logged and "model.latent_len" in logged
    assert run.data.params == {k: "null" if v is None else str(v) for k, v in logged.items()}
    assert run.info.status == "KILLED"


def test_reconcile_starts_the_trials_a_dead_driver_enqueued(tmp_path, storage):
    study = new_study(tmp_path)
    cell = {"train.lr": 1e-3, "model.d_model": 64, "model.d_attn": 128}
    study.study.enqueue_trial(cell)
    assert states(study) == {0: "WAITING"}

    notes = reconcile(new_study(tmp_path), storage, new_tracker(tmp_path, storage))

    assert notes == [
        "trial 0: enqueued before the driver stopped; it will run now",
        "trial 0: was interrupted; it will continue from its checkpoint",
    ]
    [trial] = new_study(tmp_path).trials()
    assert trial.state == TrialState.RUNNING and trial.params == cell


def test_reconcile_completes_an_extended_trial_only_once_it_reached_its_new_limit(tmp_path, storage):
    study = new_study(tmp_path)
    number = new_trial(study)
    params = study.trial_spec(number).logged_params
    records = write_records(storage, number, history([0.5, 0.6]), finished=True)
    settle(study, number, Outcome.COMPLETE, records.progress())
    first = new_tracker(tmp_path, storage)
    first.open_run(number, params)
    first.trial_ended(number, Outcome.COMPLETE)
    new_study(tmp_path).continue_trial(number, 4)  # `seqae sweep extend --epochs 4`

    # A driver trains it on to epoch 3 of 4 and dies: it stays RUNNING, to train on.
    new_tracker(tmp_path, storage).open_run(number, params)
    write_records(storage, number, history([0.5, 0.6, 0.7]), finished=False)
    notes = reconcile(new_study(tmp_path), storage, new_tracker(tmp_path, storage), lift_drain=False)
    assert notes == [f"MLflow run of trial {number} closed as KILLED (interrupted, until the trial continues)"]
    assert states(new_study(tmp_path)) == {number: "RUNNING"}

    # The next one trains it to epoch 4 and dies before recording that: the records say it finished.
    new_tracker(tmp_path, storage).open_run(number, params)
    write_records(storage, number, history([0.5, 0.6, 0.7, 0.9]), finished=True)
    notes = reconcile(new_study(tmp_path), storage, new_tracker(tmp_path, storage), lift_drain=False)
    assert notes == [
        f"trial {number}: had finished training; recorded as complete",
        f"MLflow run of trial {number} closed as FINISHED (complete)",
    ]
    [trial] = new_study(tmp_path).trials()
    assert trial.state == TrialState.COMPLETE and trial.values == [0.9]
    assert trial.intermediate_values == {1: 0.5, 2: 0.6, 3: 0.7, 4: 0.9}
    [run] = new_tracker(tmp_path, storage).trial_runs().values()
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert [m.step for m in client.get_metric_history(run.info.run_id, M.VAL_TOKEN_ACCURACY)] == [1, 2, 3, 4]
    assert run.info.status == "FINISHED"


@pytest.mark.parametrize("lift_drain", [pytest.param(True, id="resume-lifts"), pytest.param(False, id="extend-keeps")])
def test_reconcile_lifts_a_drain_only_when_asked_and_a_stop_now_always(tmp_path, storage, lift_drain):
    """`--now` stopped the last session's trials: a new session's trials (an extend's too) train."""
    new_study(tmp_path).set_control(drain="stopped by `seqae sweep stop --now`", now=True, max_concurrent=3)

    notes = reconcile(new_study(tmp_path), storage, new_tracker(tmp_path, storage), lift_drain=lift_drain)

    control = new_study(tmp_path).control()
    assert control.max_concurrent == 3 and control.now is False  # only the drain, and the stop now, lifted
    if lift_drain:
        assert notes == [
            "the sweep had stopped starting trials (stopped by `seqae sweep stop --now`); resuming lifts that"
        ]
        assert control.drain is None
        assert [entry.get("drain", "-") for entry in control.log] == ["stopped by `seqae sweep stop --now`", None]
    else:
        assert notes == []
        assert control.drain == "stopped by `seqae sweep stop --now`"
        assert [entry.get("now", "-") for entry in control.log] == [True, None]


# -- a write retried after MLflow committed part of it ------------------------------------------
def test_an_epoch_written_again_after_its_answer_was_lost_is_logged_once(tmp_path, storage):
    """MLflow's ``log_batch`` commits metrics and tags in separate transactions, so an outage can
    land the metrics and fail the batch; the writer then runs the same call again. Every epoch must
    still be in the run's history once (the CI failure this guards: ``[1, 1, 2, ...]`` after a
    PostgreSQL restart)."""
    study = new_study(tmp_path)
    tracker = new_tracker(tmp_path, storage)
    number = new_trial(study)
    tracker.open_run(number, study.trial_spec(number).logged_params)
    real, lost = tracker.client.log_batch, []

    def commits_then_fails(run_id, metrics=(), params=(), tags=()):  # noqa: ANN001, ANN202 - MlflowClient's
        real(run_id, metrics=metrics, params=params, tags=())  # the metrics' transaction commits
        if tags and not lost:
            lost.append(run_id)
            raise ConnectionError("server closed the connection before answering")  # the tags' does not
        real(run_id, tags=tags)

    tracker.client.log_batch = commits_then_fails
    node = {"node_ip": "127.0.0.1"}
    with pytest.raises(ConnectionError):
        tracker.trial_result(number, epoch_record(epoch=1, val_token_accuracy=0.5), node, {})
    tracker.trial_result(number, epoch_record(epoch=1, val_token_accuracy=0.5), node, {})  # the writer's retry
    tracker.trial_result(number, epoch_record(epoch=2, val_token_accuracy=0.6), node, {})

    run_id = tracker.child_run(number)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert lost and [(m.step, m.value) for m in client.get_metric_history(run_id, M.VAL_TOKEN_ACCURACY)] == [
        (1, 0.5),
        (2, 0.6),
    ]
    assert client.get_run(run_id).data.tags["ray.node_ip"] == "127.0.0.1"


def test_an_outage_recorded_again_is_logged_once_and_two_outages_of_one_length_twice(tmp_path, storage):
    """The writer records each outage's length on the sweep's run as a write of its own, which it
    retries like any other: the same outage written twice is one row, two outages two rows."""
    tracker = new_tracker(tmp_path, storage)
    tracker.note_outage(1, 12.5)
    tracker.note_outage(1, 12.5)  # the writer's retry after the answer was lost
    tracker.note_outage(2, 12.5)  # a second outage, as long as the first
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert tracker.parent_run_id is not None
    outages = client.get_metric_history(tracker.parent_run_id, "mlflow_outage_seconds")
    assert sorted((m.step, m.value) for m in outages) == [(1, 12.5), (2, 12.5)]
