"""Narrowing a sweep's search space in place (`seqae sweep set NAME search.KEY=...`).

A narrowed key's distribution is kept in the sweep's study (:data:`NARROWED`, beside the control
record), where its driver, here or on a cluster, reads it at each proposal: the sweep file and
``sweep.json`` stay as they were, so the sweep's fingerprint, its resume check and its history
are those of one sweep. A range may shrink and a choice go, never the other way: a wider space
is a new sweep (`seqae sweep fork`). Trials already outside the new space stay in the history,
and status marks them.

How the sampler stays inside: Optuna lets a numeric distribution's range change from trial to
trial, so a narrowed number is suggested in its new range. A categorical distribution may not
change ("does not support dynamic value space"), so a narrowed choice is suggested among the
sweep's original choices, by a sampler wrapped in :class:`Narrowed`: a proposal outside the kept
choices is not taken, and the wrapped sampler is asked again; after a few tries a kept choice is
drawn at random. The history keeps one distribution per key, so multivariate TPE, GP and NSGA-II
go on learning from every trial.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalChoiceType, CategoricalDistribution
from optuna.trial import FrozenTrial

from seqae_core.borders import OptunaAttrs
from seqae_errors import ConfigError
from sweeps.spec.sections import Distribution

NARROWED = "seqae.narrowed"  # the study's: {"space": {key: distribution}, "log": [{at, by, key, ...}]}
TRIES = 8  # proposals the wrapped sampler may make outside the kept choices before one is drawn at random


@dataclass(frozen=True)
class Narrowing:
    """One `seqae sweep set search.KEY=...`, as the study's log keeps it: when (the asking
    machine's local time), by whom, the key and the distribution it narrowed to."""

    at: str
    by: str
    key: str
    to: Distribution


@dataclass(frozen=True)
class Narrowings:
    """The study's :data:`NARROWED` attribute, read once (:meth:`of`): each narrowed key's
    distribution now, and every narrowing, oldest first."""

    space: Mapping[str, Distribution] = field(default_factory=dict)
    log: tuple[Narrowing, ...] = ()

    @classmethod
    def of(cls, attrs: OptunaAttrs) -> Narrowings:
        """From the study's user attributes (none narrowed: empty)."""
        kept = attrs.get(NARROWED, {})
        return cls(
            {k: Distribution.model_validate(v) for k, v in kept.get("space", {}).items()},
            tuple(
                Narrowing(e["at"], e["by"], e["key"], Distribution.model_validate(e["to"])) for e in kept.get("log", [])
            ),
        )

    def narrowed(self, key: str, new: Distribution, by: str, at: str) -> Narrowings:
        """These narrowings with ``key`` narrowed to ``new``, logged."""
        return Narrowings({**self.space, key: new}, (*self.log, Narrowing(at, by, key, new)))

    def record(self) -> dict[str, object]:
        """As the study keeps it: ``{"space": {key: distribution}, "log": [{at, by, key, to}]}``."""
        return {
            "space": {k: d.model_dump() for k, d in self.space.items()},
            "log": [{"at": e.at, "by": e.by, "key": e.key, "to": e.to.model_dump()} for e in self.log],
        }


def space(search: Mapping[str, Distribution], narrowings: Narrowings) -> dict[str, Distribution]:
    """The sweep's searched distributions as they are now: the file's, narrowed."""
    return {**search, **narrowings.space}


def outside(params: Mapping[str, CategoricalChoiceType], current: Mapping[str, Distribution]) -> list[str]:
    """The keys of a trial's ``params`` whose values the current space no longer holds."""
    return [k for k, v in params.items() if k in current and not current[k].contains(v)]


def notes(narrowings: Narrowings, outside_trials: dict[int, list[str]]) -> list[str]:
    """What status and the report say of a narrowed space: each narrowing, and the trials outside."""
    said = [f"search.{e.key} narrowed in place to {_shown(e.to)} ({e.at}, by {e.by})" for e in narrowings.log]
    if outside_trials:
        listed = ", ".join(f"{n} ({', '.join(keys)})" for n, keys in sorted(outside_trials.items()))
        count = "1 trial lies" if len(outside_trials) == 1 else f"{len(outside_trials)} trials lie"
        said.append(f"{count} outside the narrowed space, kept in the history: {listed}")
    return said


def _shown(dist: Distribution) -> str:
    return str(list(dist.choices)) if dist.type == "categorical" else f"[{dist.low:g}, {dist.high:g}]"


def check(key: str, value: Any, original: dict[str, Distribution], now: dict[str, Distribution]) -> Distribution:
    """``search.KEY=value`` as a distribution inside the key's current one: a mapping (a sweep
    file's distribution), or a list (a categorical's choices kept; a number's ``[low, high]``).
    Anything else, or a wider space, is refused in one line naming the key."""
    where = f"search.{key}"
    if key not in original:
        raise ConfigError(
            f"{where}: the sweep does not search {key} (it searches "
            f"{', '.join(original) or 'nothing'}); a new key is a new sweep: `seqae sweep fork`"
        )
    old = now[key]
    if isinstance(value, list):
        value = (
            {"type": old.type, "choices": value}
            if old.type == "categorical"
            else {"type": old.type, "low": value[0], "high": value[-1]}
            if len(value) == 2
            else None
        )
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where}={value!r}: give the choices to keep ([a, b]), a range ([low, high]) or a "
            "distribution ({type: ..., low: ..., high: ...})"
        )
    value = {
        "type": old.type,
        **({"step": old.step} if old.step else {}),
        **({"log": True} if old.log else {}),
        **({"when": {k: list(v) for k, v in old.when.items()}} if old.when else {}),
        **value,
    }
    try:
        new = Distribution.model_validate(value)
    except ValueError as exc:
        raise ConfigError(f"{where}={value!r}: {str(exc).splitlines()[-1]}") from None
    fork = "; a wider or different space is a new sweep: `seqae sweep fork`"
    if (new.type, new.log, new.step or 1, new.when) != (old.type, old.log, old.step or 1, old.when):
        raise ConfigError(
            f"{where}: only its range or choices may narrow (type, log, step and when stay {old.type}, "
            f"{old.log}, {old.step or 1}, {dict(old.when)}){fork}"
        )
    if new.type == "categorical":
        added = [c for c in new.choices if c not in old.choices]
        if added:
            raise ConfigError(
                f"{where}: {added[0]!r} is not one of its choices {list(old.choices)}: choices are "
                f"removed, never added{fork}"
            )
        return new
    assert new.low is not None and new.high is not None and old.low is not None and old.high is not None
    if new.low < old.low or new.high > old.high:
        raise ConfigError(
            f"{where}: [{new.low:g}, {new.high:g}] is wider than its range [{old.low:g}, {old.high:g}]: "
            f"a range shrinks, never grows{fork}"
        )
    if new.type == "int" and (new.low - old.low) % (old.step or 1):
        raise ConfigError(f"{where}: low={new.low:g} is not on its step {old.step} from {old.low:g}")
    return new


def suggested(dist: Distribution, original: Distribution) -> Distribution:
    """What Optuna is asked to suggest for a key now ``dist``: a number in its narrowed range, a
    categorical among its original choices (see the module's docstring)."""
    return original if dist.type == "categorical" else dist


class Narrowed(optuna.samplers.BaseSampler):
    """``base``, with every narrowed categorical key's proposals kept among its kept choices (the
    study's :data:`NARROWED`, read at each trial)."""

    def __init__(self, base: optuna.samplers.BaseSampler, seed: int | None = None) -> None:
        self.base = base
        self._random = random.Random(seed)

    def _kept(self, study: optuna.Study) -> dict[str, tuple[Any, ...]]:
        return {k: d.choices for k, d in Narrowings.of(study.user_attrs).space.items() if d.type == "categorical"}

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, CategoricalChoiceType]:
        kept = self._kept(study)
        proposed = self.base.sample_relative(study, trial, search_space)
        # a value outside is left to sample_independent below, which keeps inside
        return {k: v for k, v in proposed.items() if k not in kept or v in kept[k]}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        kept = self._kept(study).get(param_name) if isinstance(param_distribution, CategoricalDistribution) else None
        if kept is None:
            return self.base.sample_independent(study, trial, param_name, param_distribution)
        for _ in range(TRIES):
            value = self.base.sample_independent(study, trial, param_name, param_distribution)
            if value in kept:
                return value
        return self._random.choice(list(kept))

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: optuna.trial.TrialState, values: Any) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
