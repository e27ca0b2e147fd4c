"""The control channel of a running sweep: what its driver is asked to do, kept in its study.

`seqae sweep stop|set` on any machine, a reached target, a spent budget or a session that ran
changed code write it (:class:`Control`), as does `seqae sweep stop --trial` for one trial; the
sweep's driver reads it before each new trial and as each epoch ends, wherever it runs. The
study's owner is kept beside it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from seqae_core import names as N
from seqae_core.borders import OptunaAttrs
from seqae_errors import ConfigError
from sweeps.stores.study_trials import StudyTrials


@dataclass(frozen=True)
class Control:
    """What the sweep's driver is asked to do, kept in its study (:data:`N.CONTROL`), where the
    driver and a user's command on another machine both reach it: `seqae sweep stop|set`, a
    reached target or a spent budget, a session that ran changed code."""

    drain: str | None = None  # why no new trial starts; None: they do
    now: bool = False  # the running trials stop at the end of their epoch (`stop --now`)
    max_concurrent: int | None = None  # `seqae sweep set`'s; None: the sweep file's
    code_change: str | None = None  # the last session that ran changed code: what changed
    log: tuple[dict[str, Any], ...] = ()  # every change, with the time it was made, oldest first

    @classmethod
    def of(cls, attrs: OptunaAttrs) -> Control:
        """The record a study's user ``attrs`` keep (:data:`N.CONTROL`; none: nothing asked)."""
        record = attrs.get(N.CONTROL, {})
        return cls(**{**record, "now": bool(record.get("now")), "log": tuple(record.get("log", ()))})

    def changed(self, by: str | None = None, **changes: Any) -> Control:
        """This record with ``changes`` (a key set to None is cleared), each logged with the time
        and, for a user's change, ``by`` whom (:func:`sweeps.stores.ownership.check`)."""
        if unknown := sorted(changes.keys() - ({f.name for f in fields(self)} - {"log"})):
            raise ValueError(f"the control record has no settable key {unknown[0]!r}")
        entry = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), **({"by": by} if by else {}), **changes}
        return replace(self, **{**changes, "now": bool(changes.get("now", self.now))}, log=(*self.log, entry))

    def record(self) -> dict[str, object]:
        """As the study keeps it (and ``seqae sweep status --json`` prints it)."""
        return {
            f.name: list(v) if f.name == "log" else v for f in fields(self) if (v := getattr(self, f.name)) is not None
        }


@dataclass(frozen=True)
class StopRequest:
    """`seqae sweep stop --trial N [--now]`, kept in the trial's Optuna record (:data:`N.STOP`)."""

    by: str  # who asked (sweeps.stores.ownership.check)
    at: str  # when, in the asking machine's local time
    now: bool  # at the end of the running epoch (`--now`), not at the next validation


def _stop_request(trial: FrozenTrial) -> StopRequest | None:
    asked = trial.user_attrs.get(N.STOP)
    return None if asked is None else StopRequest(**asked)


class ControlChannel(StudyTrials):
    """What users ask of a running sweep: `seqae sweep stop|set`, `stop --trial`, the objective's target."""

    def control(self) -> Control:
        """The control record the study keeps (:class:`Control`)."""
        return Control.of(self.storage.get_study_user_attrs(self.study_id))

    def set_control(self, by: str | None = None, **changes: Any) -> Control:
        """Merge ``changes`` into the control record (:meth:`Control.changed`), and keep it."""
        control = self.control().changed(by, **changes)
        self.storage.set_study_user_attr(self.study_id, N.CONTROL, control.record())
        return control

    @property
    def owner(self) -> str | None:
        """The user the sweep belongs to, as its driver recorded it (None: a study from before owners)."""
        return self.storage.get_study_user_attrs(self.study_id).get(N.OWNER)

    def claim(self, owner: str) -> None:
        """Record ``owner`` as the sweep's, unless the study names one already."""
        if self.owner is None:
            self.storage.set_study_user_attr(self.study_id, N.OWNER, owner)

    def ask_stop(self, number: int, request: StopRequest) -> None:
        """Ask running trial ``number`` to stop; its driver reads it (:meth:`stops_asked`), wherever
        it runs. A trial that is not running is refused."""
        trial = self._own(number, "stop")
        if trial.state != TrialState.RUNNING:
            raise ConfigError(
                f"--trial {number}: trial {number} is {trial.state.name}, not running; there is nothing to stop"
            )
        self.storage.set_trial_user_attr(self._trial_id(number), N.STOP, asdict(request))

    def stops_asked(self) -> dict[int, StopRequest]:
        """The running trials a user asked to stop (:meth:`ask_stop`), with each request."""
        return {
            t.number: request
            for t in self.trials()
            if t.state == TrialState.RUNNING and (request := _stop_request(t)) is not None
        }

    def stop_asked(self, number: int) -> StopRequest | None:
        """The stop a user asked of running trial ``number`` (:meth:`ask_stop`), if any: one record read."""
        trial = self._running(number)
        return None if trial is None else _stop_request(trial)
