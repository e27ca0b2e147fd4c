"""The Optuna storage of a sweep, riding out a restart of its database or a dropped connection.

:class:`PatientStorage` sits in front of Optuna's own storage (an ``RDBStorage`` behind the cache
Optuna itself puts there) and passes every call through :func:`sweeps.stores.outages.patiently`: an
error that says the database is away (:func:`transient`: the connection refused or dropped, the
server shutting down or starting up) is retried with backoff, for ``SEQAE_STORAGE_RETRY_SECONDS``
(default 120) at most; any other error, an integrity error or Optuna's own, is raised at once. A
database that stays away past the limit ends the command with
:class:`~seqae_errors.StorageUnreachable`, one line naming the storage (its password masked);
from then on every call of this storage fails at once, so a driver stops without waiting again
for each call it still makes.

A retry must not do twice what the failed attempt did: the database may have committed it and
only its answer been lost. Reads and Optuna's upserts (attributes, intermediate values,
parameters: a second insert's integrity error is ignored by Optuna) are safe to repeat; the
three calls that are not first look for what the lost attempt left:

- ``create_new_trial`` marks each new trial with a token (system attribute ``seqae.created``) and,
  after a failed attempt, returns the trial holding it if there is one. Optuna's own storage
  retries a failed creation too, inside one call, and so may record a trial twice: the second
  record is failed at once and :func:`duplicates` names it, so the sweep passes over it (its
  number stays unused);
- ``set_trial_state_values`` returns success if the trial already has the state and values;
- ``create_new_study`` returns the study of that name if it exists.

These checks trust that one process writes the study, as the sweep's lock makes it: a trial
another process finished, or a study it created, in the moment the answer was lost would be
taken for this one's.

SQLite has no connection to lose: its errors (a locked database waits out its own 60 s timeout,
a full or read-only disk) are never an outage here, and are raised at once as before.
"""

from __future__ import annotations

import copy
import logging
import sqlite3
import uuid
from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from seqae_core import names as N
from seqae_core.borders import OptunaAttrs
from seqae_errors import StorageUnreachable
from sweeps.stores.outages import FIRST_WAIT, MAX_WAIT, Service, retry_seconds, waited_for
from sweeps.stores.workspace import redact

if TYPE_CHECKING:  # BaseStorage.get_all_studies returns it, from Optuna's private module only
    from optuna.study._frozen import FrozenStudy

log = logging.getLogger(__name__)
T = TypeVar("T")


def transient(exc: BaseException) -> bool:
    """Whether a storage call failed because the database is away, not because of what it asked:
    a DB-API error SQLAlchemy saw drop the connection, or one of the driver's connection-level
    classes (OperationalError, InterfaceError: refused, reset, the server shutting down or
    starting up). Optuna raises most of them as the cause of a ``StorageInternalError``."""
    for error in (exc, exc.__cause__):
        if isinstance(error, sqlalchemy.exc.DBAPIError):
            if error.connection_invalidated:
                return True
            connection_level = isinstance(error, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError))
            return connection_level and not isinstance(error.orig, sqlite3.Error)
    return False


class PatientStorage(BaseStorage):
    """Optuna's storage ``backend``, each call retried through an outage of the database at ``url``."""

    def __init__(
        self,
        connect: Callable[[], BaseStorage],
        url: str,
        seconds: float | None = None,
        first_wait: float = FIRST_WAIT,
        max_wait: float = MAX_WAIT,
    ) -> None:
        self.seconds = retry_seconds() if seconds is None else seconds
        self.first_wait, self.max_wait = first_wait, max_wait
        self.lost: StorageUnreachable | None = None  # set once the database stayed away past the limit
        self.outages: list[float] = []  # how long each outage this storage rode out lasted, in seconds
        self.service = Service(
            "the Optuna storage", f"the Optuna storage {redact(url)}", "check that its database is up and reachable"
        )
        self.backend = self._call("connecting", connect)

    def _call(self, what: str, call: Callable[[], T], again: Callable[[], T] | None = None) -> T:
        """``call()``, retried while the database is away; an attempt after a failed one runs
        ``again()`` instead when given: the failed attempt may have committed. Once the database
        stayed away past the limit, every call fails at once with the same error."""
        if self.lost is not None:
            raise self.lost
        try:
            return waited_for(
                self.service,
                what,
                call,
                transient,
                log,
                self.seconds,
                again,
                self.first_wait,
                self.max_wait,
                self.outages,
            )
        except StorageUnreachable as lost:
            self.lost = lost
            raise

    # -- the calls that must not be done twice --------------------------------------------------
    def create_new_study(self, directions: Sequence[StudyDirection], study_name: str | None = None) -> int:
        def again() -> int:
            if study_name is not None:
                try:
                    return self.backend.get_study_id_from_name(study_name)
                except KeyError:
                    pass
            return self.backend.create_new_study(directions, study_name)

        return self._call(
            f"creating study {study_name}", lambda: self.backend.create_new_study(directions, study_name), again
        )

    def delete_study(self, study_id: int) -> None:
        def again() -> None:
            try:
                self.backend.delete_study(study_id)
            except KeyError:  # the failed attempt deleted it
                pass

        self._call("deleting a study", lambda: self.backend.delete_study(study_id), again)

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        token = uuid.uuid4().hex
        template = optuna.trial.create_trial(state=TrialState.RUNNING) if template_trial is None else template_trial
        template = copy.copy(template)  # the caller's is left as it was
        template.system_attrs = {**template.system_attrs, N.CREATED: token}

        def create() -> int:
            self.backend.create_new_trial(study_id, template)
            found = self._created(study_id, token)
            assert found is not None, "a trial created is found by its token"
            return found

        def again() -> int:
            found = self._created(study_id, token)  # the failed attempt may have created it
            return create() if found is None else found

        return self._call("creating a trial", create, again)

    def _created(self, study_id: int, token: str) -> int | None:
        """The id of the trial created with ``token``, if there is one. Optuna's own storage retries
        a creation that failed (up to five times), so a commit whose answer was lost leaves a second
        record with the same token: it is failed if it is still open, and :func:`duplicates` names
        it, for the sweep to pass over."""
        records = [
            t for t in self.backend.get_all_trials(study_id, deepcopy=False) if t.system_attrs.get(N.CREATED) == token
        ]
        for extra in records[1:]:
            log.warning(
                "Optuna created trial %d twice (a commit whose answer the database lost, retried); "
                "its second record, %d, is not a trial",
                records[0].number,
                extra.number,
            )
            if not extra.state.is_finished():
                self.backend.set_trial_state_values(
                    self.backend.get_trial_id_from_study_id_trial_number(study_id, extra.number), TrialState.FAIL
                )
        return self.backend.get_trial_id_from_study_id_trial_number(study_id, records[0].number) if records else None

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        def again() -> bool:
            trial = self.backend.get_trial(trial_id)
            if trial.state == state and (values is None or trial.values == list(values)):
                return True  # the failed attempt set them
            return self.backend.set_trial_state_values(trial_id, state, values)

        return self._call(
            f"setting trial {trial_id} {state.name}",
            lambda: self.backend.set_trial_state_values(trial_id, state, values),
            again,
        )

    # -- the rest: reads and upserts, safe to repeat --------------------------------------------
    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call(f"setting the study's {key}", lambda: self.backend.set_study_user_attr(study_id, key, value))

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call(f"setting the study's {key}", lambda: self.backend.set_study_system_attr(study_id, key, value))

    def get_study_id_from_name(self, study_name: str) -> int:
        return self._call("reading a study", lambda: self.backend.get_study_id_from_name(study_name))

    def get_study_name_from_id(self, study_id: int) -> str:
        return self._call("reading a study", lambda: self.backend.get_study_name_from_id(study_id))

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self._call("reading a study", lambda: self.backend.get_study_directions(study_id))

    def get_study_user_attrs(self, study_id: int) -> OptunaAttrs:
        return self._call("reading a study", lambda: self.backend.get_study_user_attrs(study_id))

    def get_study_system_attrs(self, study_id: int) -> OptunaAttrs:
        return self._call("reading a study", lambda: self.backend.get_study_system_attrs(study_id))

    def get_all_studies(self) -> list[FrozenStudy]:
        return self._call("listing the studies", self.backend.get_all_studies)

    def set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: optuna.distributions.BaseDistribution,
    ) -> None:
        self._call(
            f"setting trial {trial_id}'s {param_name}",
            lambda: self.backend.set_trial_param(trial_id, param_name, param_value_internal, distribution),
        )

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        self._call(
            f"reporting trial {trial_id}'s step {step}",
            lambda: self.backend.set_trial_intermediate_value(trial_id, step, intermediate_value),
        )

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._call(f"setting trial {trial_id}'s {key}", lambda: self.backend.set_trial_user_attr(trial_id, key, value))

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._call(
            f"setting trial {trial_id}'s {key}", lambda: self.backend.set_trial_system_attr(trial_id, key, value)
        )

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self._call(
            "reading a trial", lambda: self.backend.get_trial_id_from_study_id_trial_number(study_id, trial_number)
        )

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self._call("reading a trial", lambda: self.backend.get_trial(trial_id))

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        return self._call("reading the trials", lambda: self.backend.get_all_trials(study_id, deepcopy, states))

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        return self._call("reading the best trial", lambda: self.backend.get_best_trial(study_id))

    def remove_session(self) -> None:
        self.backend.remove_session()


def storage_lost(exc: BaseException) -> StorageUnreachable | None:
    """The :class:`~seqae_errors.StorageUnreachable` that ``exc`` is, or was raised from or while
    handling (Ray Tune re-raises a searcher's error as its own)."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        if isinstance(error, StorageUnreachable):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def duplicates(trials: list[FrozenTrial]) -> set[int]:
    """The numbers of the trials that are a second record of one creation (:meth:`PatientStorage._created`)."""
    seen: set[str] = set()
    extra = set()
    for trial in sorted(trials, key=lambda t: t.number):
        token = trial.system_attrs.get(N.CREATED)
        if token is not None and token in seen:
            extra.add(trial.number)
        elif token is not None:
            seen.add(token)
    return extra


def open_storage(url: str) -> PatientStorage:
    """The sweep's Optuna storage at ``url``: Optuna's ``RDBStorage``, behind the cache of finished
    trials that Optuna itself puts in front of one (``optuna.storages.get_storage``), behind
    :class:`PatientStorage`. A SQLite file waits up to 60 s for another process's lock; a server's
    pooled connections are checked before use, so one a restart closed is replaced."""
    if url.startswith("sqlite:"):
        engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
    return PatientStorage(lambda: optuna.storages.get_storage(optuna.storages.RDBStorage(url, engine_kwargs)), url)
