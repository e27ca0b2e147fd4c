"""Continuation records: a finished trial trained on (`seqae sweep extend --epochs`) or trained
again (`seqae sweep retry`). Optuna does not reopen a finished trial, so a new RUNNING record
takes its place under its number (:data:`N.CONTINUES`), which :class:`~sweeps.stores.study_trials.StudyTrials`
then shows as the trial.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from seqae_core import names as N
from seqae_core.borders import OptunaAttrs
from seqae_errors import ConfigError
from sweeps.stores.study_trials import StudyTrials


class Continuations(StudyTrials):
    """Finished trials reopened: `extend --epochs` trains them on, `retry` trains failed ones again."""

    def continue_trial(self, number: int, epochs: int) -> None:
        """Reopen finished trial ``number`` to train on to ``epochs`` (`seqae sweep extend`): a new
        RUNNING record with its parameters and values per epoch takes its place."""
        old = self.storage.get_trial(self._trial_id(number))
        trial_id = self.storage.create_new_trial(
            self.study_id,
            template_trial=optuna.trial.create_trial(
                state=TrialState.RUNNING,
                params=old.params,
                distributions=old.distributions,
                intermediate_values=old.intermediate_values,
                user_attrs={**_carried(old.user_attrs), N.CONTINUES: number, N.EPOCHS: epochs},
            ),
        )
        self._records[number] = self.storage.get_trial_number_from_id(trial_id)

    def epochs(self, number: int) -> int | None:
        """The epoch limit `seqae sweep extend` raised trial ``number``'s to, if it did."""
        return self.storage.get_trial(self._trial_id(number)).user_attrs.get(N.EPOCHS)

    def continuing(self) -> dict[int, int]:
        """The trials `seqae sweep extend` reopened that have not trained to their new limit yet,
        with that limit."""
        return {
            t.number: t.user_attrs[N.EPOCHS]
            for t in self.trials()
            if t.state == TrialState.RUNNING and N.EPOCHS in t.user_attrs
        }

    def retry(self, number: int, epochs: dict[int, float] | None = None) -> int:
        """Train failed trial ``number`` again, with its parameters (`seqae sweep retry`): Optuna does
        not reopen a finished trial, so a new RUNNING record takes its place under its number
        (:data:`N.CONTINUES`, as `extend` does), naming the failed record (:data:`N.RETRY_OF`) and
        its attempt (:data:`N.ATTEMPT`); the failed record stays, FAIL. ``epochs``: the intermediate
        values of the epochs it continues after (its kept checkpoint's). Returns the attempt."""
        old = self._own(number, "retry")
        if old.state != TrialState.FAIL:
            raise ConfigError(f"--trials: trial {number} is {old.state.name}; only failed trials are retried")
        attempt = attempts(old) + 1
        trial_id = self.storage.create_new_trial(
            self.study_id,
            template_trial=optuna.trial.create_trial(
                state=TrialState.RUNNING,
                params=old.params,
                distributions=old.distributions,
                intermediate_values=epochs or {},
                user_attrs={
                    **{k: v for k, v in _carried(old.user_attrs).items() if k not in _OUTCOME_ATTRS},
                    N.CONTINUES: number,
                    N.RETRY_OF: self._records.get(number, number),
                    N.ATTEMPT: attempt,
                },
            ),
        )
        self._records[number] = self.storage.get_trial_number_from_id(trial_id)
        return attempt

    def retried_fresh(self, number: int) -> bool:
        """Whether trial ``number`` is a retry (:meth:`retry`) that no driver has run yet."""
        attrs = self.storage.get_trial(self._trial_id(number)).user_attrs
        return N.ATTEMPT in attrs and N.TRAINED not in attrs


_OUTCOME_ATTRS = (N.TEST, N.SEEDS, N.CONSTRAINTS, N.TRAINED)  # what a trial's end wrote: a new attempt has none yet


def _carried(attrs: OptunaAttrs) -> OptunaAttrs:
    """A record's user attributes, as a newer record of the same trial takes them: without a stop
    asked of the older one."""
    return {k: v for k, v in attrs.items() if k != N.STOP}


def attempts(trial: optuna.trial.FrozenTrial) -> int:
    """Which attempt at its configuration a trial's record is (`seqae sweep retry`): 1 unless retried."""
    return int(trial.user_attrs.get(N.ATTEMPT, 1))
