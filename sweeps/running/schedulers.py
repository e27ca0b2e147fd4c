"""The sweep's schedulers: Ray's ASHA and asynchronous Hyperband, whose rungs are rebuilt from
the trials' records when a session starts (:class:`ResumableASHA`), ASHA's rungs racing the
incumbent (:class:`RacingASHA`), and their multi-objective form, which ranks a rung by
non-dominated sorting (:class:`ParetoASHA`); each of them, and Tune's FIFO, keeps to the sweep's
share of the cluster's slots (:class:`Preempting`). :func:`rungs_for` builds the one a sweep file's
``scheduler`` names."""

from __future__ import annotations

from typing import Any

import numpy as np
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.result import DONE

from seqae_core import metrics as M
from seqae_core.borders import PickleState, TuneResult
from seqae_core.pareto import behind
from sweeps.running import ray_private as RP
from sweeps.running.progress import say
from sweeps.running.slots import Slots
from sweeps.running.stoppers import TrialStops
from sweeps.spec.sections import Objective
from sweeps.spec.sweep import SweepSpec
from sweeps.spec.trial import TrialSpec


class Preempting:
    """A scheduler that keeps its sweep within its share of the cluster's slots (``slots``; None:
    the sweep has the cluster to itself). While the sweep trains more trials than its share, a
    trial that reports a validation it would go on from is paused instead (Tune checkpoints it and
    gives its slot up; the trial resumes from its own checkpoint store, so its numbers are those of
    an uninterrupted run), and a paused trial is resumed only while the sweep trains fewer. The
    scheduler's own decision is taken first, so that ASHA's rungs record the validation as they
    would have: a trial ASHA stops is stopped, never paused."""

    slots: Slots | None = None
    trial_stops: TrialStops | None = None  # `seqae sweep stop --trial`: stopped through Tune at each step

    def __getstate__(self) -> PickleState:
        # Tune pickles its scheduler into tuner.pkl; the seat's and the study's database handles stay on the driver
        return {k: v for k, v in self.__dict__.items() if k not in ("slots", "trial_stops")}

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: TuneResult) -> str:
        decision: str = super().on_trial_result(tune_controller, trial, result)  # type: ignore[misc]
        if (
            self.slots is None
            or decision != tune.schedulers.TrialScheduler.CONTINUE
            or result.get("finished")
            or result.get(DONE)
        ):
            return decision
        pausing: set[str] = getattr(self, "_pausing", set())  # asked to pause, still training until saved
        self._pausing = pausing & {t.trial_id for t in tune_controller.get_trials() if t.status == Trial.RUNNING}
        training = [
            t for t in tune_controller.get_trials() if t.status == Trial.RUNNING and t.trial_id not in self._pausing
        ]
        if len(training) <= self.slots.allowed:
            return decision
        self._pausing.add(trial.trial_id)
        say(
            f"seqae: trial {trial.config['trial'].number} gives its slot up at epoch {result.get(M.EPOCH)} "
            f"({self.slots.why or 'the sweep holds more than its share'}); it resumes from this checkpoint"
        )
        return tune.schedulers.TrialScheduler.PAUSE

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        """Tune's choice (a waiting trial first, then a paused one), but no paused one while the
        sweep trains or waits for its share already. Tune calls it at each step of its loop: the trials
        a user stopped by hand that are not to wait for their next validation stop here first."""
        if self.trial_stops is not None:
            self.trial_stops.sweep(tune_controller)
        chosen: Trial | None = super().choose_trial_to_run(tune_controller)  # type: ignore[misc]
        if self.slots is None or chosen is None or chosen.status != Trial.PAUSED:
            return chosen
        active = sum(t.status in (Trial.RUNNING, Trial.PENDING) for t in tune_controller.get_trials())
        return chosen if active < self.slots.allowed else None


class SharedFIFO(Preempting, tune.schedulers.FIFOScheduler):
    """Tune's FIFO (every trial trains to its end), within the sweep's share."""


class ResumableASHA(tune.schedulers.ASHAScheduler):
    """Ray's ASHA (or, with several ``brackets``, its asynchronous Hyperband), whose rungs live in
    the driver's memory only (ray-project/ray#30838), rebuilt from the trials' checkpoint records
    when a session starts: each trial of an earlier session counts at every rung it reached, and a
    continued trial keeps its place in them, so it is promoted or stopped as it would have been had
    the driver not died. (With trials running concurrently, which trials reached a rung before
    another is not recorded; the rebuilt rungs hold them all.) A trial's bracket is drawn from its
    number, with Ray's odds, so that it is the same in every session. It reads Ray's private
    brackets, rungs and trials through :mod:`sweeps.running.ray_private`."""

    def __init__(
        self, history: dict[int, list[dict[str, Any]]], objectives: tuple[Objective, ...], **kwargs: Any
    ) -> None:
        """``history``: each earlier trial's records (its checkpoint records' results). A rung at
        ``m`` epochs holds the first record at or past it, as Tune's ASHA recorded it then: with
        train.validate_every below an epoch, the epochs trained are fractions and a rung may be too."""
        super().__init__(**kwargs)
        self._objectives = objectives
        sizes = np.array([len(RP.rungs(bracket)) for bracket in RP.brackets(self)])
        odds = np.exp(sizes - sizes.max())  # Ray's: more trials to the brackets with more rungs
        self._odds = odds / odds.sum()
        for number, records in history.items():
            for milestone, recorded in RP.rungs(self.bracket_of(number)):
                reached = next((r for r in records if float(r[M.EPOCH]) >= milestone), None)
                if reached is not None:
                    recorded[f"past-{number}"] = self.value(reached)

    def value(self, record: TuneResult) -> RP.RungValue:
        """What a rung records of an epoch's ``record`` (a result as Tune hands it, or a trial's
        history record, which holds the same metrics): the objective's value, turned to be
        maximized (Ray's ASHA records it so)."""
        return self._objectives[0].sign * float(record[self._objectives[0].metric])

    def behind(self, bracket: Any, others: dict[str, RP.RungValue], mine: RP.RungValue) -> bool:
        """Whether ``mine`` falls below the rung's cutoff among ``others`` (Ray's rule)."""
        cutoff = RP.cutoff(bracket, others)
        return cutoff is not None and mine < cutoff

    def bracket_of(self, number: int) -> Any:
        """Trial ``number``'s bracket (Ray's ``_Bracket``)."""
        brackets = RP.brackets(self)
        if len(brackets) == 1:
            return brackets[0]
        return brackets[int(np.random.default_rng(number).choice(len(brackets), p=self._odds))]

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: TuneResult) -> str:
        """ASHA's decision, except that a starting point always goes on: it is evaluated to the full
        budget (its values still count at each rung, as any trial's)."""
        decision = self.decide(tune_controller, trial, result)
        before_the_end = result.get(RP.time_attr(self), 0) < RP.max_t(self)
        return tune.schedulers.TrialScheduler.CONTINUE if trial.config["trial"].start and before_the_end else decision

    def decide(self, tune_controller: Any, trial: Trial, result: TuneResult) -> str:
        return super().on_trial_result(tune_controller, trial, result)

    def stops(self, number: int, start: bool = False) -> bool:
        """Whether a continued trial falls below a cutoff at a rung it passed before the crash
        (a starting point never does: it runs to the full budget)."""
        if start:
            return False
        bracket = self.bracket_of(number)
        for _, recorded in reversed(RP.rungs(bracket)):  # lowest rung first
            mine = recorded.get(f"past-{number}")
            if mine is not None and self.behind(
                bracket, {k: v for k, v in recorded.items() if k != f"past-{number}"}, mine
            ):
                return True
        return False

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        super().on_trial_add(tune_controller, trial)
        number = trial.config["trial"].number
        bracket = self.bracket_of(number)
        RP.place_trial(self, trial.trial_id, bracket)
        for _, recorded in RP.rungs(bracket):  # a continued trial's rungs passed are its own again
            if (value := recorded.pop(f"past-{number}", None)) is not None:
                recorded[trial.trial_id] = value


class RacingASHA(ResumableASHA):
    """ASHA's rungs with a stricter rule, racing the incumbent: a trial goes on past a rung only if
    it is at least as good there as the best trial recorded at that rung so far (the first to reach
    a rung always goes on), where ASHA lets on the best 1 in ``reduction_factor``. It spends the
    epochs of a sweep on the trials that could still become its best, at the risk of stopping a
    slow starter that would have overtaken. Resumes as :class:`ResumableASHA` does. It replaces
    each Ray bracket's cutoff (the rule ASHA and :meth:`ResumableASHA.behind` read:
    :func:`sweeps.running.ray_private.race`)."""

    def __init__(
        self, history: dict[int, list[dict[str, Any]]], objectives: tuple[Objective, ...], **kwargs: Any
    ) -> None:
        super().__init__(history, objectives, **kwargs)
        for bracket in RP.brackets(self):
            RP.race(bracket, _best_so_far)  # the one rule racing changes


def _best_so_far(recorded: dict[str, float]) -> float | None:
    """A racing rung's cutoff: the best value recorded there (None while it holds none)."""
    return max(recorded.values()) if recorded else None


class ParetoASHA(ResumableASHA):
    """ASHA (or asynchronous Hyperband) over several objectives: a rung records each trial's
    objectives, every one turned to be maximized, and a trial reaching it goes on unless
    non-dominated sorting puts it behind the best 1 in ``reduction_factor`` of the trials recorded
    there and itself (:func:`seqae_core.pareto.behind`); a trial on the rung's front always goes on.
    Syne Tune's MO-ASHA ranks the same way and breaks ties in rank as well; here they go on
    together. Resumes as :class:`ResumableASHA` does."""

    def value(self, record: TuneResult) -> tuple[float, ...]:
        return tuple(o.sign * float(record[o.metric]) for o in self._objectives)

    def behind(self, bracket: Any, others: dict[str, RP.RungValue], mine: RP.RungValue) -> bool:
        vectors = [v for v in others.values() if isinstance(v, tuple)]
        assert isinstance(mine, tuple) and len(vectors) == len(others)  # its rungs hold value()'s vectors only
        return behind(vectors, mine, 1 / RP.reduction_factor(bracket))

    def decide(self, tune_controller: Any, trial: Trial, result: TuneResult) -> str:
        """Ray's ASHA step for a vector: at the end, stop; at the highest rung the trial reached and
        has no value at yet, record it there and go on unless it is behind."""
        if RP.time_attr(self) not in result:
            return tune.schedulers.TrialScheduler.CONTINUE
        if result[RP.time_attr(self)] >= RP.max_t(self):
            return tune.schedulers.TrialScheduler.STOP
        return self._record(trial, float(result[RP.time_attr(self)]), self.value(result))

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: TuneResult) -> None:
        if RP.time_attr(self) in result:
            self._record(trial, float(result[RP.time_attr(self)]), self.value(result))
        RP.forget_trial(self, trial.trial_id)

    def _record(self, trial: Trial, reached: float, mine: tuple[float, ...]) -> str:
        """Record ``mine`` at the highest rung the trial ``reached`` (its progress) and has no value
        at yet; whether it stops there."""
        bracket = RP.bracket_of_trial(self, trial.trial_id)
        for milestone, recorded in RP.rungs(bracket):  # the highest rung first
            if reached >= milestone and trial.trial_id not in recorded:
                others = dict(recorded)
                recorded[trial.trial_id] = mine
                return (
                    tune.schedulers.TrialScheduler.STOP
                    if self.behind(bracket, others, mine)
                    else tune.schedulers.TrialScheduler.CONTINUE
                )
        return tune.schedulers.TrialScheduler.CONTINUE


class SharedASHA(Preempting, ResumableASHA):
    """:class:`ResumableASHA` within the sweep's share."""


class SharedParetoASHA(Preempting, ParetoASHA):
    """:class:`ParetoASHA` within the sweep's share."""


class SharedRacingASHA(Preempting, RacingASHA):
    """:class:`RacingASHA` within the sweep's share: a trial the race lets on may still give its
    slot up, and one it stops is stopped, never paused."""


Rungs = SharedASHA | SharedRacingASHA | SharedParetoASHA


def rungs_for(spec: SweepSpec, history: dict[int, list[dict[str, Any]]], epochs: int) -> Rungs:
    """The scheduler ``spec.scheduler`` names (not ``none``) for trials of at most ``epochs``,
    its rungs rebuilt from ``history`` (:class:`ResumableASHA`): several objectives rank a rung by
    non-dominated sorting, ``race`` races the incumbent (one objective: the spec refuses more)."""
    settings = spec.scheduler
    kind: type[Rungs] = (
        SharedParetoASHA if spec.multi_objective else SharedRacingASHA if settings.type == "race" else SharedASHA
    )
    return kind(
        history,
        spec.objectives,
        time_attr=M.EPOCH,
        max_t=epochs,
        grace_period=settings.grace_period,
        reduction_factor=settings.reduction_factor,
        brackets=settings.brackets(epochs),
    )


def stub_trial(spec: TrialSpec, trial_id: str | None = None) -> Trial:
    """A Tune trial that carries ``spec`` and nothing else: what a scheduler reads of a trial (its
    id, by default its number, and config), for a pack's members (:mod:`sweeps.running.packs`) and a
    simulated sweep's trials (:mod:`sweeps.running.simulation`)."""
    return Trial("replay", config={"trial": spec}, trial_id=trial_id or str(spec.number), stub=True)
