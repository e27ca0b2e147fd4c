"""Fork seeding: a new sweep's study starts with another sweep's finished trials that fit its
space (`seqae sweep fork`), which its sampler learns from; they never count toward its own trials.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from seqae_core import names as N
from seqae_core.config import build
from sweeps.spec.sections import Distribution
from sweeps.spec.sweep import trial_layers
from sweeps.stores.proposals import optuna_distribution
from sweeps.stores.study_trials import StudyTrials


class Forks(StudyTrials):
    """A forked sweep's study: the trials it was seeded with, and the seeding."""

    def forked(self) -> list[optuna.trial.FrozenTrial]:
        """Finished trials of another sweep that `seqae sweep fork` seeded the study with."""
        return [t for t in self._held() if N.FORKED in t.user_attrs]

    def seed_from(self, origin: StudyTrials) -> list[str]:
        """Add ``origin``'s complete trials that fit this sweep's space as finished trials, which
        TPE learns from (they never count toward this sweep's trials); returns a note per trial.
        A parameter this sweep no longer searches is dropped (said when its value differed); a
        trial with a value outside this sweep's space is left out. Both sweeps have the same
        objectives (``lifecycle.fork`` checks)."""
        space = {k: Distribution(type="categorical", choices=v) for k, v in self.spec.grid_keys().items()}
        space |= {key: self.spec.search[key] for key in self.spec.sampling_order()}
        notes = []
        for trial in origin.trials():
            if trial.state != TrialState.COMPLETE:
                continue
            values = origin.spec.values_of(trial.params)
            old = build(trial_layers(origin.spec.source, origin.spec.base, values)).flat()
            params: dict[str, Any] = {}
            for key, dist in space.items():
                if dist.active(params):
                    params[key] = values.get(key, old[key])
            outside = [f"{k}={v!r}" for k, v in params.items() if not space[k].contains(v)]
            if outside:
                notes.append(f"trial {trial.number}: left out, {', '.join(outside)} outside the new space")
                continue
            new = build(trial_layers(self.spec.source, self.spec.base, params)).flat()
            dropped = [f"{k}={v!r} (now {new[k]!r})" for k, v in values.items() if k not in space and new[k] != v]
            self.study.add_trial(
                optuna.trial.create_trial(
                    params=self.spec.recorded(params),
                    distributions={k: optuna_distribution(space[k]) for k in params},
                    values=trial.values,
                    intermediate_values=trial.intermediate_values,
                    # a starting point seeded from the origin is not tried again; its test scores, seeds and
                    # epochs trained stay beside its values
                    user_attrs={
                        N.FORKED: f"{origin.study.study_name}#{trial.number}",
                        **{
                            a: trial.user_attrs[a]
                            for a in (N.START, N.TEST, N.SEEDS, N.TRAINED)
                            if a in trial.user_attrs
                        },
                    },
                )
            )
            notes.append(f"trial {trial.number}: seeded" + (f"; dropped {', '.join(dropped)}" if dropped else ""))
        return notes
