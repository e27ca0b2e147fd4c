"""The sweep's Optuna study: the durable record of which trials exist and how they ended.

:class:`SweepStudy` is the one object the driver, the searcher and the commands hold; each of its
jobs has its own module: the trials as the study records them (:mod:`sweeps.stores.study_trials`),
proposals and packs (:mod:`sweeps.stores.proposals`), continuation records
(:mod:`sweeps.stores.continuations`), the stop/set control channel
(:mod:`sweeps.stores.control_channel`) and fork seeding (:mod:`sweeps.stores.forks`). This module
opens the study and records the trials' outcomes in it.

Only the one driver that holds the sweep's lock writes to the study, which also keeps SQLite
out of concurrent-writer trouble.
"""

from __future__ import annotations

import logging
from typing import Any

import optuna
from optuna.trial import TrialState

from seqae_core import metrics as M
from seqae_core import names as N
from seqae_errors import ConfigError
from sweeps.spec.sweep import SweepSpec
from sweeps.stores import narrowing
from sweeps.stores.continuations import Continuations
from sweeps.stores.control_channel import ControlChannel
from sweeps.stores.forks import Forks
from sweeps.stores.proposals import Proposals, sampler
from sweeps.stores.study_storage import open_storage

log = logging.getLogger(__name__)


def storage(url: str) -> optuna.storages.BaseStorage:
    """The study's storage, riding out a restart of its database (:mod:`sweeps.stores.study_storage`)."""
    return open_storage(url)


def feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial met every constraint of its sweep (a sweep without constraints: always)."""
    return all(v <= 0.0 for v in trial.user_attrs.get(N.CONSTRAINTS, []))


def study_exists(url: str, name: str) -> bool:
    return name in optuna.study.get_all_study_names(storage(url))


def kept_record(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The record of the result (the epoch, by default) early stopping kept: the first best of the
    monitored metric."""
    number = M.kept_epoch((M.result_number(h), float(h[M.MONITOR])) for h in history)
    if number is None:
        raise ValueError("a trial with no epochs kept none")
    return next(h for h in history if M.result_number(h) == number)


def best_epoch_values(spec: SweepSpec, history: list[dict[str, Any]]) -> list[float]:
    """The objective values of a trial: its metrics at the epoch early stopping kept."""
    return [float(kept_record(history)[o.metric]) for o in spec.objectives]


def directions_of(spec: SweepSpec) -> list[optuna.study.StudyDirection]:
    return [
        optuna.study.StudyDirection.MAXIMIZE if o.mode == "max" else optuna.study.StudyDirection.MINIMIZE
        for o in spec.objectives
    ]


def read_only(spec: SweepSpec, url: str, name: str) -> SweepStudy:
    """A sweep's study, for reading (status, reports): loaded without writing anything, so a
    read-only workspace still shows what it holds. Before the sweep starts, it is empty."""
    backend = storage(url)
    try:
        study = optuna.load_study(study_name=name, storage=backend)
    except KeyError:  # the sweep was recorded but its driver has not created the study yet
        backend = optuna.storages.InMemoryStorage()
        study = optuna.create_study(storage=backend, study_name=name, directions=directions_of(spec))
    return SweepStudy(spec, study, backend, total=0)


def open_study(spec: SweepSpec, url: str, name: str, total: int, fingerprint: str) -> SweepStudy:
    """The sweep's study for its driver, created on first use; refused if another sweep owns it."""
    backend = storage(url)
    study = optuna.create_study(storage=backend, study_name=name, directions=directions_of(spec), load_if_exists=True)
    held = len(study.get_trials(deepcopy=False))
    study.sampler = narrowing.Narrowed(sampler(spec, total, held), seed=held)  # `seqae sweep set search.KEY=...`
    owner = study.user_attrs.get(N.FINGERPRINT)
    if owner is None:
        study.set_user_attr(N.FINGERPRINT, fingerprint)
        study.set_metric_names([o.metric for o in spec.objectives])  # optuna-dashboard's and Optuna's plots' labels
    elif owner != fingerprint:
        raise ConfigError(
            f"the Optuna study {name!r} belongs to another sweep (fingerprint {owner}); choose another --name"
        )
    return SweepStudy(spec, study, backend, total)


class SweepStudy(Proposals, Continuations, ControlChannel, Forks):
    """A sweep's study, with each of its jobs; this module's own are the trials' outcomes."""

    # -- outcomes ----------------------------------------------------------------------------
    def report(self, number: int, epoch: int, value: float, trained: float) -> None:
        """A result's objective ``value``, as an intermediate value at ``epoch``, its result number
        (:func:`seqae_core.metrics.result_number`: the epoch's by default; single-objective sweeps),
        and the epochs it had ``trained``."""
        if self.spec.multi_objective:
            return
        trial = self._running(number)
        # Tune may hand a trial's last result to both of the searcher's hooks: report it once.
        if trial is not None and epoch not in trial.intermediate_values:
            self.storage.set_trial_intermediate_value(self._trial_id(number), epoch, value)
            self.storage.set_trial_user_attr(self._trial_id(number), N.TRAINED, trained)

    def complete(self, number: int, history: list[dict[str, Any]]) -> None:
        """Complete a trial with its values from ``history``, and the epochs' intermediate values no
        driver reported (it finished while none ran: the trial's record is then as if one had)."""
        trial = self._running(number)  # read once: a driver that saw the trial run reported every epoch
        reported = trial.intermediate_values if trial is not None else {}
        for record in history if trial is not None else []:
            if M.result_number(record) not in reported:
                self.report(
                    number,
                    M.result_number(record),
                    float(record[self.spec.objectives[0].metric]),
                    float(record[M.EPOCH]),
                )
        self.study.tell(self._records.get(number, number), best_epoch_values(self.spec, history), skip_if_finished=True)

    def note_kept(self, number: int, history: list[dict[str, Any]]) -> None:
        """Keep, for status and reports, what the checkpoint a running trial kept scored: its test
        metrics, and for a trial of several seeds, each seed's value and the standard error of
        every repeated metric (validation and test)."""
        if not history or self._running(number) is None:
            return
        kept = kept_record(history)
        for attr, values in (
            (N.TEST, {k: kept[k] for k in M.TEST_METRICS if k in kept}),
            (N.SEEDS, {k: v for k, v in kept.items() if M.is_spread(k)}),
            (N.CONSTRAINTS, self.spec.violations(kept)),
        ):
            if values:
                self.storage.set_trial_user_attr(self._trial_id(number), attr, values)

    def tell(self, number: int, state: TrialState) -> None:
        """End a trial without values (pruned or failed)."""
        self.study.tell(self._records.get(number, number), state=state, skip_if_finished=True)

    def note_tune_trial(self, number: int, tune_trial_id: str) -> None:
        trial = self._running(number)
        if trial is not None:
            ids = list(trial.user_attrs.get(N.TUNE_TRIAL_IDS, []))
            if tune_trial_id not in ids:
                self.storage.set_trial_user_attr(self._trial_id(number), N.TUNE_TRIAL_IDS, ids + [tune_trial_id])

    def best(self, trials: list[optuna.trial.FrozenTrial] | None = None) -> list[optuna.trial.FrozenTrial]:
        """The best trial, or the Pareto front of a multi-objective sweep, of its own trials
        (``trials``: those already read from ``trials()``, so a caller that has them reads once)."""
        trials = self.trials() if trials is None else trials
        if self.spec.multi_objective:
            own = {t.number for t in trials if t.state == TrialState.COMPLETE and feasible(t)}
            return [t for t in self.study.best_trials if t.number in own] if own else []
        return self.ranked(trials)[:1]

    def ranked(self, trials: list[optuna.trial.FrozenTrial] | None = None) -> list[optuna.trial.FrozenTrial]:
        """The complete trials of a single-objective sweep that meet its constraints, best first
        (the lower number first on a tie); ``trials`` as for ``best``."""
        sign = 1.0 if self.spec.objectives[0].mode == "max" else -1.0
        own = [
            t for t in (self.trials() if trials is None else trials) if t.state == TrialState.COMPLETE and feasible(t)
        ]
        return sorted(own, key=lambda t: (-sign * t.values[0], t.number))
