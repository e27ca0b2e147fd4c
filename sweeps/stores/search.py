"""The sweep's Optuna study: the durable record of which trials exist and how they ended.

A sweep trial *is* an Optuna trial; its number is the trial's identity everywhere (checkpoint
folder, MLflow run, Tune trial name). A finished Optuna trial cannot change its values, so a trial
that `seqae sweep extend --epochs` trains on is recorded by a new Optuna trial that continues it
(user attribute ``seqae.continues``); :class:`SweepStudy` shows each sweep trial once, under its
own number, as its newest record. Grid cells are enqueued as fixed parameters, searched keys
are sampled. Because the study lives in persistent storage, a new driver rebuilds everything
from it: trials that finished are never re-run, interrupted ones (still RUNNING) are continued
from their checkpoints, and new ones are asked for until the planned total is reached.

Only the one driver that holds the sweep's lock writes to the study, which also keeps SQLite
out of concurrent-writer trouble. Trials are addressed by number through Optuna's public
storage interface (``BaseStorage``), never through its private attributes.
"""

from __future__ import annotations

import copy
import functools
import logging
import random
import time
import warnings
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

import optuna
from optuna.trial import TrialState

from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.config import FREE_KEYS, build, fusion_key
from seqae_errors import ConfigError
from sweeps.spec.sections import Distribution
from sweeps.spec.sweep import SweepSpec, trial_layers
from sweeps.spec.trial import TrialSpec
from sweeps.stores import narrowing
from sweeps.stores.study_storage import duplicates, open_storage

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)
# multivariate and group TPE have been "experimental" since Optuna 2.2; the sweep file pins them on
# knowingly, and a warning per driver start would only teach users to ignore warnings.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

FINAL = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


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
    def of(cls, record: dict[str, Any]) -> Control:
        return cls(**{**record, "now": bool(record.get("now")), "log": tuple(record.get("log", ()))})

    def changed(self, by: str | None = None, **changes: Any) -> Control:
        """This record with ``changes`` (a key set to None is cleared), each logged with the time
        and, for a user's change, ``by`` whom (:func:`sweeps.stores.ownership.check`)."""
        if unknown := sorted(changes.keys() - ({f.name for f in fields(self)} - {"log"})):
            raise ValueError(f"the control record has no settable key {unknown[0]!r}")
        entry = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), **({"by": by} if by else {}), **changes}
        return Control.of({**self.record(), **changes, "log": [*self.log, entry]})

    def record(self) -> dict[str, Any]:
        """As the study keeps it (and ``seqae sweep status --json`` prints it)."""
        return {f.name: list(v) if f.name == "log" else v for f in fields(self) if (v := getattr(self, f.name)) is not None}


def storage(url: str) -> optuna.storages.BaseStorage:
    """The study's storage, riding out a restart of its database (:mod:`sweeps.stores.study_storage`)."""
    return open_storage(url)


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
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(2, min(50, total // 3)),
                                             constraints_func=bounds)
    if settings.type == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=settings.n_startup_trials or 0,
                                         constraints_func=bounds)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=settings.n_startup_trials or 0,
                                      multivariate=bool(settings.multivariate), group=bool(settings.group),
                                      constant_liar=bool(settings.constant_liar), constraints_func=bounds)


def shaped_like(base: optuna.samplers.BaseSampler, params: dict[str, Any]) -> optuna.samplers.BaseSampler:
    """``base`` with every value of ``params`` fixed but those of :data:`~seqae_core.config.FREE_KEYS`:
    how a pack's members after its first are proposed (``resources.fuse``; :meth:`SweepStudy.next_pack`)."""
    return optuna.samplers.PartialFixedSampler({k: v for k, v in params.items() if k not in FREE_KEYS}, base)


def violations(count: int, trial: optuna.trial.FrozenTrial) -> list[float]:
    """How far a finished trial's kept checkpoint is outside each of the ``count`` constraints
    (Optuna's ``constraints_func``); a trial that kept no checkpoint meets none."""
    return list(trial.user_attrs.get(N.CONSTRAINTS) or [1.0] * count)


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
    return [optuna.study.StudyDirection.MAXIMIZE if o.mode == "max" else optuna.study.StudyDirection.MINIMIZE
            for o in spec.objectives]


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
        raise ConfigError(f"the Optuna study {name!r} belongs to another sweep (fingerprint {owner}); "
                          "choose another --name")
    return SweepStudy(spec, study, backend, total)


class SweepStudy:
    def __init__(self, spec: SweepSpec, study: optuna.Study, backend: optuna.storages.BaseStorage,
                 total: int) -> None:
        self.spec, self.study, self.storage, self.total = spec, study, backend, total
        self.study_id = backend.get_study_id_from_name(study.study_name)
        self._issued: set[int] = set()
        self._deferred: list[TrialSpec] = []  # asked for a pack it could not join (next_pack): the next trial
        self._records = {t.user_attrs[N.CONTINUES]: t.number for t in self._held()
                         if N.CONTINUES in t.user_attrs}  # sweep trial -> its newest Optuna trial, if not itself

    def _held(self) -> list[optuna.trial.FrozenTrial]:
        """Every record in the study, but a second record Optuna made of one trial (``duplicates``)."""
        records = self.study.get_trials(deepcopy=False)
        extra = duplicates(records)
        return [t for t in records if t.number not in extra] if extra else records

    def _trial_id(self, number: int) -> int:
        """The storage's id of sweep trial ``number``'s newest record."""
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, self._records.get(number, number))

    # -- what users ask of a running sweep: `seqae sweep stop|set`, the objective's target ------
    def control(self) -> Control:
        """The control record the study keeps (:class:`Control`)."""
        return Control.of(self.storage.get_study_user_attrs(self.study_id).get(N.CONTROL, {}))

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

    # -- the trials --------------------------------------------------------------------------
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

    def continue_trial(self, number: int, epochs: int) -> None:
        """Reopen finished trial ``number`` to train on to ``epochs`` (`seqae sweep extend`): a new
        RUNNING record with its parameters and values per epoch takes its place."""
        old = self.storage.get_trial(self._trial_id(number))
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=optuna.trial.create_trial(
            state=TrialState.RUNNING, params=old.params, distributions=old.distributions,
            intermediate_values=old.intermediate_values,
            user_attrs={**_carried(old.user_attrs), N.CONTINUES: number, N.EPOCHS: epochs}))
        self._records[number] = self.storage.get_trial_number_from_id(trial_id)

    def epochs(self, number: int) -> int | None:
        """The epoch limit `seqae sweep extend` raised trial ``number``'s to, if it did."""
        return self.storage.get_trial(self._trial_id(number)).user_attrs.get(N.EPOCHS)

    def continuing(self) -> dict[int, int]:
        """The trials `seqae sweep extend` reopened that have not trained to their new limit yet,
        with that limit."""
        return {t.number: t.user_attrs[N.EPOCHS] for t in self.trials()
                if t.state == TrialState.RUNNING and N.EPOCHS in t.user_attrs}

    def forked(self) -> list[optuna.trial.FrozenTrial]:
        """Finished trials of another sweep that `seqae sweep fork` seeded the study with."""
        return [t for t in self._held() if N.FORKED in t.user_attrs]

    def seed_from(self, origin: SweepStudy) -> list[str]:
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
            self.study.add_trial(optuna.trial.create_trial(
                params=self.spec.recorded(params), distributions={k: optuna_distribution(space[k]) for k in params}, values=trial.values,
                intermediate_values=trial.intermediate_values,
                # a starting point seeded from the origin is not tried again; its test scores, seeds and
                # epochs trained stay beside its values
                user_attrs={N.FORKED: f"{origin.study.study_name}#{trial.number}",
                            **{a: trial.user_attrs[a] for a in (N.START, N.TEST, N.SEEDS, N.TRAINED) if a in trial.user_attrs}}))
            notes.append(f"trial {trial.number}: seeded" + (f"; dropped {', '.join(dropped)}" if dropped else ""))
        return notes

    def counts(self) -> dict[str, int]:
        return dict(Counter(trial.state.name for trial in self.trials()))

    def numbers(self, state: TrialState) -> list[int]:
        return [t.number for t in self.trials() if t.state == state]

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

    def _propose_like(self, first: dict[str, Any]) -> TrialSpec:
        """A new trial of the shape of the one whose values are ``first`` (see :meth:`next_pack`)."""
        cells = [cell for cell in self.spec.cells()
                 if all(first[k] == v for k, v in cell.items() if k not in FREE_KEYS)]
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

    def _propose(self, asked: optuna.Trial, proposer: str) -> dict[str, Any]:
        """Give an asked trial its parameters, then record who proposed them: last, so a trial
        without its proposer is one whose driver died before it had them all (``_suggest_late``)."""
        params = self._suggest(asked)
        asked.set_user_attr(N.PROPOSED_BY, proposer)
        return params

    def _suggest_late(self, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
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

    def _spec_of(self, trial: optuna.trial.FrozenTrial, params: dict[str, Any], continued: bool = False) -> TrialSpec:
        """Trial ``trial`` with ``params``, at the epochs and starting point it recorded."""
        return self._spec(trial.number, params, continued, epochs=trial.user_attrs.get(N.EPOCHS),
                          start=trial.user_attrs.get(N.START))

    def _spec(self, number: int, params: dict[str, Any], continued: bool = False,
              epochs: int | None = None, start: str | None = None) -> TrialSpec:
        limit = {"train.epochs": epochs} if epochs else {}  # raised by `seqae sweep extend`
        point = self.spec.start.get(start or "", {})  # a starting point's keys the search does not sample
        try:
            config = build(trial_layers(self.spec.source, self.spec.base, point | params | limit))
        except ConfigError as exc:
            return TrialSpec(number, params, None, str(exc), continued, start)
        return TrialSpec(number, params, config, None, continued, start)

    def remaining(self) -> int:
        """How many trials a session still has to run: unfinished ones plus those not yet created."""
        trials = self.trials()
        unfinished = sum(t.state not in FINAL for t in trials)
        return unfinished + max(0, self.total - len(trials))

    def start_waiting(self) -> list[int]:
        """Give the WAITING trials (enqueued by a driver that died before starting them) their
        parameters; they run as interrupted ones. Returns their numbers."""
        started = []
        for _ in self.numbers(TrialState.WAITING):
            trial = self.study.ask()  # pops the oldest WAITING trial, with its fixed parameters
            self._propose(trial, "start" if N.START in trial.user_attrs else "grid")
            started.append(trial.number)
        return started

    def _emptiest_cell(self, trials: list[optuna.trial.FrozenTrial],
                       cells: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The one of ``cells`` (default: the grid's) the fewest ``trials`` have trained."""
        cells = self.spec.cells() if cells is None else cells
        if cells == [{}]:
            return {}
        filled = [sum(all(t.params.get(k) == v for k, v in cell.items()) for t in trials) for cell in cells]
        return cells[filled.index(min(filled))]

    def _suggest(self, trial: optuna.Trial) -> dict[str, Any]:
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
        return narrowing.space(self.spec.search, self.storage.get_study_user_attrs(self.study_id))

    def narrow(self, key: str, value: Any, by: str) -> Distribution:
        """Narrow searched ``key`` to ``value`` (:func:`sweeps.stores.narrowing.check`) from the
        next proposal on, and log it."""
        attrs = self.storage.get_study_user_attrs(self.study_id)
        new = narrowing.check(key, value, self.spec.search, narrowing.space(self.spec.search, attrs))
        self.storage.set_study_user_attr(self.study_id, narrowing.NARROWED,
                                         narrowing.record(attrs, key, new, by, time.strftime("%Y-%m-%d %H:%M:%S")))
        return new

    def outside(self) -> dict[int, list[str]]:
        """The sweep's trials whose values the narrowed space no longer holds, with those keys."""
        space = self.space()
        return {t.number: keys for t in self.trials() if (keys := narrowing.outside(t.params, space))}

    def narrowing_notes(self) -> list[str]:
        """What status and the report say of a space narrowed in place: each narrowing, the trials outside."""
        attrs = self.storage.get_study_user_attrs(self.study_id)
        return narrowing.notes(attrs, self.outside()) if narrowing.NARROWED in attrs else []

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
                self.report(number, M.result_number(record), float(record[self.spec.objectives[0].metric]),
                            float(record[M.EPOCH]))
        self.study.tell(self._records.get(number, number), best_epoch_values(self.spec, history), skip_if_finished=True)

    def note_kept(self, number: int, history: list[dict[str, Any]]) -> None:
        """Keep, for status and reports, what the checkpoint a running trial kept scored: its test
        metrics, and for a trial of several seeds, each seed's value and the standard error of
        every repeated metric (validation and test)."""
        if not history or self._running(number) is None:
            return
        kept = kept_record(history)
        for attr, values in ((N.TEST, {k: kept[k] for k in M.TEST_METRICS if k in kept}),
                             (N.SEEDS, {k: v for k, v in kept.items() if M.is_spread(k)}),
                             (N.CONSTRAINTS, self.spec.violations(kept))):
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

    # -- by hand: `seqae sweep stop --trial`, `seqae sweep retry` ------------------------------
    def ask_stop(self, number: int, request: dict[str, Any]) -> None:
        """Ask running trial ``number`` to stop (``request``: who asked, when, whether ``now``); its
        driver reads it (:meth:`stops_asked`), wherever it runs. A trial that is not running is refused."""
        trial = self._own(number, "stop")
        if trial.state != TrialState.RUNNING:
            raise ConfigError(f"--trial {number}: trial {number} is {trial.state.name}, not running; there is nothing "
                              "to stop")
        self.storage.set_trial_user_attr(self._trial_id(number), N.STOP, request)

    def stops_asked(self) -> dict[int, dict[str, Any]]:
        """The running trials a user asked to stop (:meth:`ask_stop`), with each request."""
        return {t.number: t.user_attrs[N.STOP] for t in self.trials()
                if t.state == TrialState.RUNNING and N.STOP in t.user_attrs}

    def stop_asked(self, number: int) -> dict[str, Any] | None:
        """The stop a user asked of running trial ``number`` (:meth:`ask_stop`), if any: one record read."""
        trial = self._running(number)
        return None if trial is None else trial.user_attrs.get(N.STOP)

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
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=optuna.trial.create_trial(
            state=TrialState.RUNNING, params=old.params, distributions=old.distributions,
            intermediate_values=epochs or {},
            user_attrs={**{k: v for k, v in _carried(old.user_attrs).items() if k not in _OUTCOME_ATTRS},
                        N.CONTINUES: number, N.RETRY_OF: self._records.get(number, number), N.ATTEMPT: attempt}))
        self._records[number] = self.storage.get_trial_number_from_id(trial_id)
        return attempt

    def retried_fresh(self, number: int) -> bool:
        """Whether trial ``number`` is a retry (:meth:`retry`) that no driver has run yet."""
        attrs = self.storage.get_trial(self._trial_id(number)).user_attrs
        return N.ATTEMPT in attrs and N.TRAINED not in attrs

    def _own(self, number: int, verb: str) -> optuna.trial.FrozenTrial:
        """Sweep trial ``number``'s newest record; a number the sweep has not is refused, naming it."""
        trial = next((t for t in self.trials() if t.number == number), None)
        if trial is None:
            raise ConfigError(f"--trial{'s' if verb == 'retry' else ''} {number}: sweep {self.study.study_name!r} has "
                              f"no trial {number} (its trials: 0 to {len(self.trials()) - 1})")
        return trial

    def state(self, number: int) -> TrialState:
        return self.storage.get_trial(self._trial_id(number)).state

    def _running(self, number: int) -> optuna.trial.FrozenTrial | None:
        trial = self.storage.get_trial(self._trial_id(number))
        return trial if trial.state == TrialState.RUNNING else None

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
        own = [t for t in (self.trials() if trials is None else trials) if t.state == TrialState.COMPLETE and feasible(t)]
        return sorted(own, key=lambda t: (-sign * t.values[0], t.number))


_OUTCOME_ATTRS = (N.TEST, N.SEEDS, N.CONSTRAINTS, N.TRAINED)  # what a trial's end wrote: a new attempt has none yet


def _carried(attrs: dict[str, Any]) -> dict[str, Any]:
    """A record's user attributes, as a newer record of the same trial takes them: without a stop
    asked of the older one."""
    return {k: v for k, v in attrs.items() if k != N.STOP}


def attempts(trial: optuna.trial.FrozenTrial) -> int:
    """Which attempt at its configuration a trial's record is (`seqae sweep retry`): 1 unless retried."""
    return int(trial.user_attrs.get(N.ATTEMPT, 1))


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


def _suggest_one(trial: optuna.Trial, key: str, dist: Distribution) -> Any:
    """``key``'s config value for ``trial`` (Optuna records an ordered choice's position)."""
    if dist.type == "categorical":
        return trial.suggest_categorical(key, list(dist.choices))
    if dist.type == "ordered":
        return dist.value_of(trial.suggest_int(key, 0, len(dist.choices) - 1))
    assert dist.low is not None and dist.high is not None  # numeric distributions have bounds
    if dist.type == "int":
        return trial.suggest_int(key, int(dist.low), int(dist.high), step=dist.step or 1, log=dist.log)
    return trial.suggest_float(key, dist.low, dist.high, log=dist.type == "loguniform")
