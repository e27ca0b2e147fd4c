"""A sweep simulated on recorded curves: the sweep's own searcher (its Optuna sampler over its
search space, proposing as the driver does) and its own scheduler (the ASHA, Hyperband, racing or
multi-objective rungs its file names), driven by a caller that plays recorded epochs back instead
of training them. Besides the API (:mod:`seqae.api`), the one door into the sweep service, for
research that replays search methods on a table of measured trainings (``research/replay.py``);
nothing in the service calls it.

    simulation = simulate(document, "a replay")     # a sweep file's mapping
    (proposal,) = simulation.ask()                   # the configuration the sweep would train next
    simulation.start(0)                              # trial 0 trains it: the scheduler sees it start
    stop = simulation.result(0, {"epoch": 1, "val_token_accuracy": 0.8})   # its first epoch's record
    simulation.study.tell(proposal.trial, state=optuna.trial.TrialState.PRUNED)  # as a stopped trial
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from seqae_core.borders import Document
from seqae_core.config import Flat, FlatValue
from sweeps.running.schedulers import Rungs, rungs_for, stub_trial
from sweeps.spec.sweep import SweepSpec, cell_configs, parse
from sweeps.spec.trial import TrialSpec
from sweeps.stores.proposals import _suggest_one, sampler, shaped_like
from sweeps.stores.search import directions_of


@dataclass(frozen=True)
class Proposal:
    """One configuration the searcher proposes: its searched keys' values, as a trial's config
    holds them (an ordered choice's level), and the study's trial they are told back to."""

    # not Flat: research's replays index their tables by a proposed value as the number it is there
    # (research/front_replay.py)
    params: dict[str, Any]
    trial: optuna.Trial


class Simulation:
    """A sweep's searcher and scheduler, without Ray, a store or a training (:func:`simulate`).
    ``study`` is its Optuna study, in memory: the caller tells it each trial's outcome as the
    driver would (a complete trial's kept value, a stopped one PRUNED)."""

    def __init__(self, spec: SweepSpec, own: optuna.samplers.BaseSampler | None = None) -> None:
        self.spec = spec
        self.study = optuna.create_study(
            directions=directions_of(spec), sampler=own or sampler(spec, spec.planned_trials())
        )
        self.epochs = max(config.train.epochs for config in cell_configs(spec))  # the most any trial trains
        self.rungs: Rungs | None = None if spec.scheduler.type == "none" else rungs_for(spec, {}, self.epochs)
        if self.rungs is not None:  # what Tune's TuneConfig tells a scheduler
            self.rungs.set_search_properties(spec.objectives[0].metric, spec.objectives[0].mode)
        self._trials: dict[int, Any] = {}  # the scheduler's view of each trial started, by number

    def ask(self, size: int = 1) -> list[Proposal]:
        """``size`` proposals, as the service fills a fused pack of that size: the sampler's own
        first, then each of the others with the first's shape fixed, the earlier ones pending while
        it is asked."""
        first = self._proposal()
        asked = [first]
        if size > 1:
            own = self.study.sampler
            self.study.sampler = shaped_like(own, first.params)
            try:
                asked += [self._proposal() for _ in range(size - 1)]
            finally:
                self.study.sampler = own
        return asked

    def _proposal(self) -> Proposal:
        trial = self.study.ask()
        params: Flat = {}
        for key in self.spec.sampling_order():  # each key after those its condition names, as the driver asks
            if self.spec.search[key].active(params):
                params[key] = _suggest_one(trial, key, self.spec.search[key])
        return Proposal(params, trial)

    def recorded(self, params: Mapping[str, FlatValue]) -> Flat:
        """What the study records of a configuration's values (an ordered choice as its position)."""
        return self.spec.recorded(params)

    def enqueue(self, params: Mapping[str, FlatValue]) -> None:
        """Propose the configuration ``params`` next, before the sampler's own (a starting point)."""
        self.study.enqueue_trial(self.recorded(params))

    def start(self, number: int, start: str | None = None) -> None:
        """Trial ``number`` starts (``start``: the starting point it runs, which the scheduler never
        stops): the scheduler places it in its bracket."""
        trial = self._trials[number] = stub_trial(TrialSpec(number, {}, None, start=start))
        if self.rungs is not None:
            self.rungs.on_trial_add(None, trial)

    def result(self, number: int, record: dict[str, float]) -> bool:
        """Trial ``number`` reports ``record`` (its ``epoch`` and objectives' values, as a trial's
        result holds them); whether the scheduler stops it there."""
        if self.rungs is None:
            return False
        return self.rungs.on_trial_result(None, self._trials[number], record) == self.rungs.STOP


def simulate(document: Document, name: str, *, own_sampler: optuna.samplers.BaseSampler | None = None) -> Simulation:
    """The searcher and scheduler of the sweep ``document`` (a sweep file's mapping, checked as
    ``seqae sweep run`` checks it: a mistake is a ConfigError naming ``name``), for a caller that
    plays back recorded curves. ``own_sampler``: an Optuna sampler to search with instead of the
    one the file names (a sampler the service does not offer over such a space)."""
    return Simulation(parse(document, name), own_sampler)
