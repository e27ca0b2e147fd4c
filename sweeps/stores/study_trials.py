"""A sweep's trials as its Optuna study records them, each once, under its own number.

A sweep trial *is* an Optuna trial; its number is the trial's identity everywhere (checkpoint
folder, MLflow run, Tune trial name). A finished Optuna trial cannot change its values, so a trial
that `seqae sweep extend --epochs` trains on, or `seqae sweep retry` trains again, is recorded by a
new Optuna trial that continues it (user attribute ``seqae.continues``:
:mod:`sweeps.stores.continuations`); :class:`StudyTrials` shows each sweep trial once, as its
newest record. Trials are addressed by number through Optuna's public storage interface
(``BaseStorage``), never through its private attributes. The sweep's other jobs on its study
build on this one (:class:`sweeps.stores.search.SweepStudy` gathers them).
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter

import optuna
from optuna.trial import TrialState

from seqae_core import names as N
from seqae_errors import ConfigError
from sweeps.spec.sweep import SweepSpec
from sweeps.stores.study_storage import duplicates

# Set in the lowest of the study's modules, so that a sampler or a study made through any of them is quiet:
optuna.logging.set_verbosity(optuna.logging.WARNING)
# multivariate and group TPE have been "experimental" since Optuna 2.2; the sweep file pins them on
# knowingly, and a warning per driver start would only teach users to ignore warnings.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

FINAL = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


class StudyTrials:
    """Sweep ``spec``'s trials in Optuna ``study`` (kept in ``backend``), of the ``total`` it plans."""

    def __init__(self, spec: SweepSpec, study: optuna.Study, backend: optuna.storages.BaseStorage, total: int) -> None:
        self.spec, self.study, self.storage, self.total = spec, study, backend, total
        self.study_id = backend.get_study_id_from_name(study.study_name)
        self._records = {
            t.user_attrs[N.CONTINUES]: t.number for t in self._held() if N.CONTINUES in t.user_attrs
        }  # sweep trial -> its newest Optuna trial, if not itself

    def _held(self) -> list[optuna.trial.FrozenTrial]:
        """Every record in the study, but a second record Optuna made of one trial (``duplicates``)."""
        records = self.study.get_trials(deepcopy=False)
        extra = duplicates(records)
        return [t for t in records if t.number not in extra] if extra else records

    def _trial_id(self, number: int) -> int:
        """The storage's id of sweep trial ``number``'s newest record."""
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, self._records.get(number, number))

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        """The sweep's own trials (not those a fork seeded the study with), each once, under its
        own number: a trial that was continued, as its newest record."""
        latest: dict[int, optuna.trial.FrozenTrial] = {}
        for trial in self._held():  # in number order: newer records last
            if N.FORKED in trial.user_attrs:
                continue
            number = trial.user_attrs.get(N.CONTINUES, trial.number)
            if number != trial.number:
                trial = copy.copy(trial)
                trial.number = number
            latest[number] = trial
        return list(latest.values())

    def counts(self) -> dict[str, int]:
        return dict(Counter(trial.state.name for trial in self.trials()))

    def numbers(self, state: TrialState) -> list[int]:
        return [t.number for t in self.trials() if t.state == state]

    def remaining(self) -> int:
        """How many trials a session still has to run: unfinished ones plus those not yet created."""
        trials = self.trials()
        unfinished = sum(t.state not in FINAL for t in trials)
        return unfinished + max(0, self.total - len(trials))

    def state(self, number: int) -> TrialState:
        return self.storage.get_trial(self._trial_id(number)).state

    def _running(self, number: int) -> optuna.trial.FrozenTrial | None:
        trial = self.storage.get_trial(self._trial_id(number))
        return trial if trial.state == TrialState.RUNNING else None

    def _own(self, number: int, verb: str) -> optuna.trial.FrozenTrial:
        """Sweep trial ``number``'s newest record; a number the sweep has not is refused, naming it."""
        trial = next((t for t in self.trials() if t.number == number), None)
        if trial is None:
            raise ConfigError(
                f"--trial{'s' if verb == 'retry' else ''} {number}: sweep {self.study.study_name!r} has "
                f"no trial {number} (its trials: 0 to {len(self.trials()) - 1})"
            )
        return trial
