"""Proposals: the sweep's sampler, and the trials and packs it asks the study for.

Grid cells are enqueued as fixed parameters, starting points first, searched keys are sampled
(define-by-run: a conditional key only when its condition holds), in the search space as
`seqae sweep set search.KEY=...` narrowed it (:mod:`sweeps.stores.narrowing`). Because the study
lives in persistent storage, a new driver rebuilds everything from it: trials that finished are
never re-run, interrupted ones (still RUNNING) are continued from their checkpoints, and new ones
are asked for until the planned total is reached. A pack (``resources.fuse``) is proposed as one
shape whose members differ only in :data:`~seqae_core.config.FREE_KEYS`.
"""

from __future__ import annotations

import functools
import random
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from seqae_core import names as N
from seqae_core.config import FREE_KEYS, Flat, FlatValue, build, fusion_key
from seqae_errors import ConfigError
from sweeps.spec.sections import Distribution
from sweeps.spec.sweep import SweepSpec, trial_layers
from sweeps.spec.trial import TrialSpec
from sweeps.stores import narrowing
from sweeps.stores.study_trials import StudyTrials


def sampler(spec: SweepSpec, total: int, held: int = 0) -> optuna.samplers.BaseSampler:
    """The sweep's sampler, for a study that already holds ``held`` trials. A new study's sampler
    is seeded with the sweep's seed; a resumed one's with a seed drawn from it and ``held``, since
    the sweep's seed alone would replay its random draws from the start, and a resumed sweep would
    propose its first trials' parameters again (Optuna keeps no sampler state in the storage).
    With constraints, the sampler reads each finished trial's :data:`N.CONSTRAINTS`: Optuna then
    proposes with them in mind and keeps the infeasible trials off its best trial and front."""
    settings = spec.sampler
    seed = settings.seed if held == 0 else random.Random(f"{settings.seed}:{held}").getrandbits(31)
    bounds = functools.partial(violations, len(spec.constraints)) if spec.constraints else None
    if settings.type == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if settings.type == "nsga2":
        return optuna.samplers.NSGAIISampler(
            seed=seed, population_size=max(2, min(50, total // 3)), constraints_func=bounds
        )
    if settings.type == "gp":
        return optuna.samplers.GPSampler(
            seed=seed, n_startup_trials=settings.n_startup_trials or 0, constraints_func=bounds
        )
    return optuna.samplers.TPESampler(
        seed=seed,
        n_startup_trials=settings.n_startup_trials or 0,
        multivariate=bool(settings.multivariate),
        group=bool(settings.group),
        constant_liar=bool(settings.constant_liar),
        constraints_func=bounds,
    )


def shaped_like(base: optuna.samplers.BaseSampler, params: Mapping[str, FlatValue]) -> optuna.samplers.BaseSampler:
    """``base`` with every value of ``params`` fixed but those of :data:`~seqae_core.config.FREE_KEYS`:
    how a pack's members after its first are proposed (``resources.fuse``; :meth:`SweepStudy.next_pack`)."""
    return optuna.samplers.PartialFixedSampler({k: v for k, v in params.items() if k not in FREE_KEYS}, base)


def violations(count: int, trial: optuna.trial.FrozenTrial) -> list[float]:
    """How far a finished trial's kept checkpoint is outside each of the ``count`` constraints
    (Optuna's ``constraints_func``); a trial that kept no checkpoint meets none."""
    return list(trial.user_attrs.get(N.CONSTRAINTS) or [1.0] * count)


class Proposals(StudyTrials):
    """The trials a driver asks for: interrupted ones to continue, new ones while the total lasts."""

    def __init__(self, spec: SweepSpec, study: optuna.Study, backend: optuna.storages.BaseStorage, total: int) -> None:
        super().__init__(spec, study, backend, total)
        self._issued: set[int] = set()
        self._deferred: list[TrialSpec] = []  # asked for a pack it could not join (next_pack): the next trial

    def next_trial(self, new: bool = True) -> TrialSpec | None:
        """An interrupted trial to continue, else (if ``new``) a new trial while the budget lasts,
        else None."""
        if self._deferred:
            return self._deferred.pop(0)
        trials = self.trials()
        for trial in trials:
            if trial.state == TrialState.RUNNING and trial.number not in self._issued:
                return self._continued(trial)
        if not new or len(trials) >= self.total:
            return None
        held = self._held()  # a fork's seeded trials too: they count for both below
        start = self._next_start(held)
        if start is not None:
            self.study.enqueue_trial(self.spec.recorded(self.spec.start_params(start)), user_attrs={N.START: start})
        elif cell := self._emptiest_cell(trials):
            self.study.enqueue_trial(cell)
        proposer = "start" if start is not None else self._proposer(held)
        asked = self.study.ask()
        params = self._propose(asked, proposer)
        self._issued.add(asked.number)
        return self._spec(asked.number, params, start=start)

    def _continued(self, trial: optuna.trial.FrozenTrial) -> TrialSpec:
        """Interrupted trial ``trial``, issued to continue from its checkpoint."""
        self._issued.add(trial.number)
        params = self.spec.values_of(trial.params) if N.PROPOSED_BY in trial.user_attrs else self._suggest_late(trial)
        return self._spec_of(trial, params, continued=True)

    def next_pack(self, size: int, new: bool = True) -> list[TrialSpec]:
        """Up to ``size`` trials of one shape (:func:`~seqae_core.config.fusion_key`) to train as one
        pack (``resources.fuse``); empty when the sweep has none left to start. The first is
        :meth:`next_trial`'s. An interrupted first is packed with other interrupted trials of its
        shape. A new one is packed with new proposals of its shape while the sweep's total lasts: the
        sampler proposes their :data:`~seqae_core.config.FREE_KEYS`, every other searched value is
        the first's (Optuna's ``PartialFixedSampler``), and a grid gives them the emptiest of the
        cells of that shape. A proposal that cannot join (its config cannot be built) waits to be
        the first of a later pack, alone."""
        first = self.next_trial(new)
        if first is None:
            return []
        pack = [first]
        if first.config is None:
            return pack
        shape = fusion_key(first.config)
        if first.continued:
            for trial in self.trials():
                if len(pack) < size and trial.state == TrialState.RUNNING and trial.number not in self._issued:
                    spec = self._spec_of(trial, self.spec.values_of(trial.params))  # its shape, before it is issued
                    if spec.config is not None and fusion_key(spec.config) == shape:
                        pack.append(self._continued(trial))
            return pack
        created = len(self.trials())  # read once: each member asked below creates one more
        while len(pack) < size and created < self.total:
            member = self._propose_like(first.params)
            created += 1
            if member.config is not None and fusion_key(member.config) == shape:
                pack.append(member)
            else:
                self._deferred.append(member)
                break
        return pack

    def _propose_like(self, first: Flat) -> TrialSpec:
        """A new trial of the shape of the one whose values are ``first`` (see :meth:`next_pack`)."""
        cells = [
            cell for cell in self.spec.cells() if all(first[k] == v for k, v in cell.items() if k not in FREE_KEYS)
        ]
        if cells != [{}]:
            self.study.enqueue_trial(self._emptiest_cell(self.trials(), cells))
        base = self.study.sampler
        self.study.sampler = shaped_like(base, self.spec.recorded(first))
        try:
            asked = self.study.ask()
            params = self._propose(asked, self._proposer(self._held()))
        finally:
            self.study.sampler = base
        self._issued.add(asked.number)
        return self._spec(asked.number, params)

    def _propose(self, asked: optuna.Trial, proposer: str) -> Flat:
        """Give an asked trial its parameters, then record who proposed them: last, so a trial
        without its proposer is one whose driver died before it had them all (``_suggest_late``)."""
        params = self._suggest(asked)
        asked.set_user_attr(N.PROPOSED_BY, proposer)
        return params

    def _suggest_late(self, trial: optuna.trial.FrozenTrial) -> Flat:
        """The parameters of a trial whose driver died after Optuna's ask created it and before the
        proposer was recorded (``_propose``): sampled now, as that driver would have, so it never
        trains the base config's values under a trial that names none. What that driver had
        suggested stays, as do a starting point's or a grid cell's enqueued values."""
        proposer = "start" if N.START in trial.user_attrs else self._proposer(self._held())
        return self._propose(optuna.Trial(self.study, self._trial_id(trial.number)), proposer)

    def _next_start(self, held: list[optuna.trial.FrozenTrial]) -> str | None:
        """The first starting point of the sweep file that no trial the study ``held`` has been yet."""
        tried = {t.user_attrs.get(N.START) for t in held}
        return next((name for name in self.spec.start if name not in tried), None)

    def _proposer(self, held: list[optuna.trial.FrozenTrial]) -> str:
        """Who proposes the next trial's searched values: the grid alone, the sampler's random
        start-up (Optuna's own rule: too few finished trials among those the study ``held``), or the sampler."""
        settings = self.spec.sampler
        if not self.spec.search:
            return "grid"
        if not settings.models:
            return str(settings.type)
        states = (TrialState.COMPLETE, TrialState.PRUNED) if settings.type == "tpe" else (TrialState.COMPLETE,)
        finished = sum(t.state in states for t in held)
        return str(settings.type) if finished >= (settings.n_startup_trials or 0) else "random start-up"

    def proposals(self) -> dict[str, int]:
        """How many of the sweep's trials each proposer proposed (``_proposer``)."""
        return dict(Counter(t.user_attrs.get(N.PROPOSED_BY, "unrecorded") for t in self.trials()))

    def trial_spec(self, number: int) -> TrialSpec:
        """Trial ``number`` as it crossed into Tune (its config rebuilt from its parameters)."""
        trial = self.storage.get_trial(self._trial_id(number))
        return self._spec_of(trial, self.spec.values_of(trial.params))

    def _spec_of(self, trial: optuna.trial.FrozenTrial, params: Flat, continued: bool = False) -> TrialSpec:
        """Trial ``trial`` with ``params``, at the epochs and starting point it recorded."""
        return self._spec(
            trial.number, params, continued, epochs=trial.user_attrs.get(N.EPOCHS), start=trial.user_attrs.get(N.START)
        )

    def _spec(
        self,
        number: int,
        params: Flat,
        continued: bool = False,
        epochs: int | None = None,
        start: str | None = None,
    ) -> TrialSpec:
        limit = {"train.epochs": epochs} if epochs else {}  # raised by `seqae sweep extend`
        point = self.spec.start.get(start or "", {})  # a starting point's keys the search does not sample
        try:
            config = build(trial_layers(self.spec.source, self.spec.base, point | params | limit))
        except ConfigError as exc:
            return TrialSpec(number, params, None, str(exc), continued, start)
        return TrialSpec(number, params, config, None, continued, start)

    def start_waiting(self) -> list[int]:
        """Give the WAITING trials (enqueued by a driver that died before starting them) their
        parameters; they run as interrupted ones. Returns their numbers."""
        started = []
        for _ in self.numbers(TrialState.WAITING):
            trial = self.study.ask()  # pops the oldest WAITING trial, with its fixed parameters
            self._propose(trial, "start" if N.START in trial.user_attrs else "grid")
            started.append(trial.number)
        return started

    def _emptiest_cell(self, trials: list[optuna.trial.FrozenTrial], cells: list[Flat] | None = None) -> Flat:
        """The one of ``cells`` (default: the grid's) the fewest ``trials`` have trained."""
        cells = self.spec.cells() if cells is None else cells
        if cells == [{}]:
            return {}
        filled = [sum(all(t.params.get(k) == v for k, v in cell.items()) for t in trials) for cell in cells]
        return cells[filled.index(min(filled))]

    def _suggest(self, trial: optuna.Trial) -> Flat:
        """The trial's grid values and searched values, define-by-run: a conditional key only
        when the keys it names took the values its condition names."""
        params = {key: trial.suggest_categorical(key, list(values)) for key, values in self.spec.grid_keys().items()}
        space = self.space()
        for key in self.spec.sampling_order():
            if space[key].active(params):
                params[key] = _suggest_one(trial, key, narrowing.suggested(space[key], self.spec.search[key]))
        return params

    def space(self) -> dict[str, Distribution]:
        """The searched distributions as they are now: the sweep file's, narrowed in place
        (:mod:`sweeps.stores.narrowing`)."""
        return narrowing.space(
            self.spec.search, narrowing.Narrowings.of(self.storage.get_study_user_attrs(self.study_id))
        )

    def narrow(self, key: str, value: Any, by: str) -> Distribution:
        """Narrow searched ``key`` to ``value`` (:func:`sweeps.stores.narrowing.check`) from the
        next proposal on, and log it."""
        now = narrowing.Narrowings.of(self.storage.get_study_user_attrs(self.study_id))
        new = narrowing.check(key, value, self.spec.search, narrowing.space(self.spec.search, now))
        self.storage.set_study_user_attr(
            self.study_id, narrowing.NARROWED, now.narrowed(key, new, by, time.strftime("%Y-%m-%d %H:%M:%S")).record()
        )
        return new

    def outside(self) -> dict[int, list[str]]:
        """The sweep's trials whose values the narrowed space no longer holds, with those keys."""
        space = self.space()
        return {t.number: keys for t in self.trials() if (keys := narrowing.outside(t.params, space))}

    def narrowing_notes(self) -> list[str]:
        """What status and the report say of a space narrowed in place: each narrowing, the trials outside."""
        narrowings = narrowing.Narrowings.of(self.storage.get_study_user_attrs(self.study_id))
        return narrowing.notes(narrowings, self.outside()) if narrowings.log else []


def optuna_distribution(dist: Distribution) -> optuna.distributions.BaseDistribution:
    """The Optuna distribution ``_suggest_one`` samples from: an ordered choice's is its position,
    an integer, which the samplers model as a number (TPE's and the GP's kernels spread what one
    value teaches to its neighbours, as they cannot across a categorical's choices)."""
    if dist.type == "categorical":
        return optuna.distributions.CategoricalDistribution(list(dist.choices))
    if dist.type == "ordered":
        return optuna.distributions.IntDistribution(0, len(dist.choices) - 1)
    assert dist.low is not None and dist.high is not None  # numeric distributions have bounds
    if dist.type == "int":
        return optuna.distributions.IntDistribution(int(dist.low), int(dist.high), log=dist.log, step=dist.step or 1)
    return optuna.distributions.FloatDistribution(dist.low, dist.high, log=dist.type == "loguniform")


def _suggest_one(trial: optuna.Trial, key: str, dist: Distribution) -> FlatValue:
    """``key``'s config value for ``trial`` (Optuna records an ordered choice's position)."""
    if dist.type == "categorical":
        return trial.suggest_categorical(key, list(dist.choices))
    if dist.type == "ordered":
        return dist.value_of(trial.suggest_int(key, 0, len(dist.choices) - 1))
    assert dist.low is not None and dist.high is not None  # numeric distributions have bounds
    if dist.type == "int":
        return trial.suggest_int(key, int(dist.low), int(dist.high), step=dist.step or 1, log=dist.log)
    return trial.suggest_float(key, dist.low, dist.high, log=dist.type == "loguniform")
