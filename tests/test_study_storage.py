"""The sweep's Optuna storage (``sweeps.stores.study_storage``) rides out its database: a dropped
connection is retried and any other error raised at once; a database that stays away past the
limit ends in one line naming the storage, password masked; a retry after a commit whose answer
was lost records nothing twice.

Real SQLite storages whose connection is made to drop, before a statement (through SQLAlchemy's
events) or just after a commit (through the connection's own ``commit``), with the error SQLite
gives on a closed connection, which SQLAlchemy takes for a disconnect as it does PostgreSQL's
"server closed the connection unexpectedly"; and a real refused connection to a PostgreSQL URL
where nothing listens. The restart of a real PostgreSQL under a running sweep is
``tests/test_cluster.py::test_a_postgresql_restart_mid_sweep_is_ridden_out_by_the_same_driver``.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import optuna
import psycopg
import pytest
import sqlalchemy
from optuna.trial import TrialState
from sqlalchemy import event

from cluster.procs import free_port
from seqae_core import names as N
from seqae_errors import StorageUnreachable
from sweeps.stores.study_storage import PatientStorage, duplicates, open_storage, storage_lost, transient

FAST = {"first_wait": 0.01, "max_wait": 0.05}


def closed() -> sqlite3.ProgrammingError:
    """What SQLite says on a connection that is gone; SQLAlchemy takes it for a disconnect."""
    return sqlite3.ProgrammingError("Cannot operate on a closed database.")


class Database:
    """A real SQLite study storage whose connection can be made to drop: before each of the next
    ``drops`` statements, or just after the next commit (the commit lands, its answer is lost)."""

    # The limit is the driver's default: on a busy machine Optuna's own retries alone take seconds.
    def __init__(self, path: Path, seconds: float = 120.0) -> None:
        self.url = f"sqlite:///{path / 'optuna.db'}"
        self.drops = 0  # statements still to fail
        self.dropped = 0  # statements failed so far
        self.lose_answers = 0  # commits still to land without their answer
        self.then_drops = 0  # statements to fail after an answer is lost (the database away from then on)
        database = self

        class Connection(sqlite3.Connection):
            def commit(self) -> None:
                super().commit()
                if database.lose_answers:
                    database.lose_answers -= 1
                    database.drops, database.then_drops = database.then_drops, 0
                    raise closed()

        self.rdb = optuna.storages.RDBStorage(self.url, engine_kwargs={"connect_args": {"factory": Connection}})
        event.listen(self.rdb.engine, "before_cursor_execute", self._before)
        self.storage = PatientStorage(lambda: optuna.storages.get_storage(self.rdb), self.url, seconds=seconds, **FAST)
        self.study_id = self.storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "s")

    def _before(self, *args: object) -> None:
        if self.drops:
            self.drops -= 1
            self.dropped += 1
            raise closed()

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        """The study's trials as a fresh reader sees them."""
        return optuna.storages.RDBStorage(self.url).get_all_trials(self.study_id)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    yield Database(tmp_path)


@pytest.mark.parametrize(
    "error, retried",
    [
        pytest.param(
            sqlalchemy.exc.OperationalError(
                "SELECT 1",
                None,
                psycopg.OperationalError(
                    "connection failed: connection to server at 127.0.0.1, port 5432 failed: Connection refused"
                ),
            ),
            True,
            id="refused",
        ),
        pytest.param(
            sqlalchemy.exc.OperationalError(
                "SELECT 1", None, psycopg.errors.AdminShutdown("terminating connection due to administrator command")
            ),
            True,
            id="server-shutting-down",
        ),
        pytest.param(
            sqlalchemy.exc.InterfaceError("SELECT 1", None, psycopg.InterfaceError("the connection is closed")),
            True,
            id="connection-closed",
        ),
        pytest.param(
            sqlalchemy.exc.ProgrammingError("SELECT 1", None, closed(), connection_invalidated=True),
            True,
            id="invalidated",
        ),
        pytest.param(
            sqlalchemy.exc.IntegrityError("INSERT", None, psycopg.errors.UniqueViolation("duplicate key")),
            False,
            id="integrity",
        ),
        pytest.param(
            sqlalchemy.exc.DataError("INSERT", None, psycopg.errors.StringDataRightTruncation("too long")),
            False,
            id="data",
        ),
        pytest.param(
            sqlalchemy.exc.OperationalError("INSERT", None, sqlite3.OperationalError("database is locked")),
            False,
            id="sqlite-locked",
        ),
        pytest.param(optuna.exceptions.UpdateFinishedTrialError("finished"), False, id="optuna-finished"),
        pytest.param(KeyError("no study"), False, id="key"),
    ],
)
def test_only_connection_level_errors_are_an_outage(error, retried):
    assert transient(error) is retried
    try:  # as Optuna's storage raises them: the cause of a StorageInternalError
        raise optuna.exceptions.StorageInternalError("during the commit") from error
    except optuna.exceptions.StorageInternalError as wrapped:
        assert transient(wrapped) is retried


def test_a_dropped_connection_is_retried_until_it_answers(db, caplog):
    trial_id = db.storage.create_new_trial(db.study_id)
    db.drops = 3
    with caplog.at_level(logging.WARNING, logger="sweeps.stores.study_storage"):
        db.storage.set_trial_user_attr(trial_id, "k", "v")
    assert db.dropped == 3 and db.trials()[0].user_attrs == {"k": "v"}
    assert "did not answer while setting trial" in caplog.text and "answers again after" in caplog.text
    assert len(db.storage.outages) == 1


def test_other_errors_are_raised_at_once(db, caplog):
    trial_id = db.storage.create_new_trial(db.study_id)
    db.storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [1.0])
    with caplog.at_level(logging.WARNING, logger="sweeps.stores.study_storage"):
        with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
            db.storage.set_trial_user_attr(trial_id, "k", "v")
        with pytest.raises(optuna.exceptions.DuplicatedStudyError):
            db.storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "s")
        with pytest.raises(KeyError):
            db.storage.get_study_id_from_name("no such study")
    assert [r.message for r in caplog.records if r.name == "sweeps.stores.study_storage"] == []  # not one retry


def test_a_database_that_stays_away_ends_in_one_line_and_every_call_after_at_once(tmp_path):
    db = Database(tmp_path, seconds=0.3)
    db.drops = 10**6
    with pytest.raises(StorageUnreachable) as lost:
        db.storage.get_all_trials(db.study_id)
    message = str(lost.value)
    assert "\n" not in message
    assert re.match(
        rf"the Optuna storage {re.escape(db.url)} did not answer for \d+ s while reading the trials "
        r"\(ProgrammingError: ",
        message,
    ), message
    assert message.endswith(
        "check that its database is up and reachable (SEQAE_STORAGE_RETRY_SECONDS sets how long seqae waits for it)"
    )
    db.drops, dropped = 0, db.dropped
    with pytest.raises(StorageUnreachable) as again:
        db.storage.get_study_user_attrs(db.study_id)
    assert again.value is lost.value and db.dropped == dropped  # no new wait
    try:  # as Ray Tune hands a searcher's error on
        try:
            raise lost.value
        except StorageUnreachable:
            raise RuntimeError("the Tune run failed")  # noqa: B904 - Tune's own, without a cause
    except RuntimeError as tune_error:
        assert storage_lost(tune_error) is lost.value


def test_a_refused_postgresql_is_named_with_its_password_masked(monkeypatch):
    monkeypatch.setenv("SEQAE_STORAGE_RETRY_SECONDS", "1")
    port = free_port()  # nothing listens there
    with pytest.raises(StorageUnreachable) as lost:
        open_storage(f"postgresql+psycopg://seqae:s3cret@127.0.0.1:{port}/optuna")
    message = str(lost.value)
    assert "\n" not in message and "s3cret" not in message
    assert re.match(
        rf"the Optuna storage {re.escape(f'postgresql+psycopg://seqae:***@127.0.0.1:{port}/optuna')} did "
        r"not answer for \d+ s while connecting \(OperationalError: ",
        message,
    ), message


def test_a_trial_whose_creation_committed_but_whose_answer_was_lost_is_one_trial(db):
    """Optuna's storage retries the creation itself, so the database holds a second record: the
    sweep passes over it, and it is closed."""
    db.lose_answers = 1
    trial_id = db.storage.create_new_trial(db.study_id)
    first, second = db.trials()
    assert db.storage.get_trial_number_from_id(trial_id) == 0
    assert first.system_attrs[N.CREATED] == second.system_attrs[N.CREATED]
    assert (first.state, second.state) == (TrialState.RUNNING, TrialState.FAIL)
    assert duplicates(db.trials()) == {1}
    assert db.storage.get_trial_number_from_id(db.storage.create_new_trial(db.study_id)) == 2
    assert duplicates(db.trials()) == {1}


def test_a_creation_retried_after_optunas_own_retries_finds_the_trial_it_made(db):
    """The answer to the creation's commit is lost, and the database is away for Optuna's own four
    retries: this storage's retry finds the trial by its token instead of creating another."""
    db.lose_answers, db.then_drops = 1, 4
    trial_id = db.storage.create_new_trial(db.study_id)
    assert db.dropped == 4 and [t.number for t in db.trials()] == [0]
    assert db.storage.get_trial_number_from_id(trial_id) == 0


def test_a_trial_told_complete_whose_answer_was_lost_is_complete_once(db):
    trial_id = db.storage.create_new_trial(db.study_id)
    db.lose_answers = 1
    # the retry finds it complete with its value (Optuna itself would refuse to finish it again)
    assert db.storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [0.5]) is True
    (told,) = db.trials()
    assert (told.state, told.values) == (TrialState.COMPLETE, [0.5])
    assert db.storage.outages  # it was retried


def test_the_storage_keeps_optunas_cache_of_finished_trials(tmp_path):
    """``open_storage`` puts Optuna's own cache (what ``optuna.create_study`` wraps an ``RDBStorage``
    in) behind the retries; this fails if Optuna changes what it wraps one in."""
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    assert isinstance(storage.backend, optuna.storages._CachedStorage)
    assert optuna.storages.get_storage(storage) is storage  # Optuna takes it as it is
