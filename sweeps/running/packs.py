"""A sweep's fused trials on the driver (``resources.fuse``): Tune runs one trial per pack, and
every other part of the sweep sees the pack's members, each the trial it is.

Tune hands a pack's events to the three adapters here (:class:`PackSearcher`,
:class:`PackScheduler`, :class:`PackCallback`), and :class:`Members` plays each to the sweep's own
searcher, scheduler, stoppers and callbacks once per member, on a stand-in Tune trial that carries
the member's :class:`~sweeps.spec.trial.TrialSpec` (:func:`~sweeps.running.schedulers.stub_trial`).
A pack's result holds a result per member that trained (and the errors of those that failed); each
goes where Tune's controller sends a trial's result, in its order: the stoppers, then the scheduler,
then (unless stopped) the searcher, then the callbacks. A member that a stopper or the scheduler
stops, that finished, or that failed ends there, as a trial ends: the searcher (which records its
outcome in the study), the scheduler and the callbacks hear of it. One stopped while the pack goes
on is marked in its record store as leaving the pack (:meth:`~seqae_core.records.RecordStore.record_leave`);
the pack's worker reads that when Tune lets it train on, which is only after the driver has decided
on the result (a function trainable's report waits for it), so the member trains no further epoch.
The pack goes on while any member does.
"""

from __future__ import annotations

import json
from typing import Any

from ray import tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher
from ray.tune.utils import flatten_dict

from seqae_core import metrics as M
from seqae_core.borders import TuneConfig, TuneResult
from seqae_core.checkpoint import CheckpointStore
from sweeps.running.callbacks import MEMBER_ERROR, PACK_TUNE_ID, last_error
from sweeps.running.schedulers import stub_trial
from sweeps.running.stoppers import DriverOnly
from sweeps.running.trial import FAILED, MEMBERS
from sweeps.running.tune_result import of_tune
from sweeps.spec.trial import TrialSpec, WorkerSpec


def member_id(pack_id: str, number: int) -> str:
    """The id by which the sweep's parts know trial ``number`` of the pack Tune knows as ``pack_id``."""
    return f"{pack_id}-{number}"


def pack_name(pack: tuple[TrialSpec, ...]) -> str:
    """A pack's Tune trial name and folder: its first member's number, and how many it holds."""
    return f"pack-{pack[0].number:04d}-of-{len(pack)}"


class Members:
    """The members of the running packs, each on its stand-in Tune trial, and the sweep's parts that
    hear of them. ``stoppers``, ``scheduler``, ``searcher`` and ``callbacks`` are those a sweep of
    unfused trials hands to Tune."""

    def __init__(
        self,
        searcher: Any,
        scheduler: TrialScheduler,
        stoppers: list[tune.Stopper],
        callbacks: list[tune.Callback],
        storage: str,
    ) -> None:
        self.searcher, self.scheduler, self.stoppers, self.callbacks = searcher, scheduler, stoppers, callbacks
        self.storage = storage
        self.packs: dict[str, Trial] = {}  # Tune's trials, by id
        self.running: dict[str, dict[int, Trial]] = {}  # pack's Tune id -> its members still training, by number
        self.controller: Any = None  # Tune's, as its scheduler hooks hand it over

    def added(self, controller: Any, pack: Trial) -> None:
        self.controller = controller
        self.packs[pack.trial_id] = pack
        members = self.running.setdefault(pack.trial_id, {})
        for spec in WorkerSpec.of_tune(pack.config).pack:
            members[spec.number] = stub_trial(spec, member_id(pack.trial_id, spec.number))
            members[spec.number].config[PACK_TUNE_ID] = pack.trial_id  # what MLflow's ray.tune_trial_id tag names
            self.scheduler.on_trial_add(controller, members[spec.number])

    def started(self, pack: Trial, **info: Any) -> None:
        for member in self.running.get(pack.trial_id, {}).values():
            for callback in self.callbacks:
                callback.on_trial_start(trial=member, **info)

    def recovered(self, pack: Trial, **info: Any) -> None:
        for member in self.running.get(pack.trial_id, {}).values():
            member.run_metadata.num_failures = pack.num_failures
            for callback in self.callbacks:
                callback.on_trial_recover(trial=member, **info)

    def result(self, controller: Any, pack: Trial, result: TuneResult) -> str:
        """Each member's result, as Tune would hand a trial's; STOP once no member trains on."""
        self.controller = controller
        members = self.running.get(pack.trial_id, {})
        for record in json.loads(result.get(MEMBERS, "[]")):  # each member's, as to_tune made it
            read = of_tune(record)
            member = members.get(read.trial)
            if member is None:  # a result Tune hands over twice (the last one, as the pack ends)
                continue
            flat = flatten_dict(dict(record))
            stopped = any(stopper(member.trial_id, record) for stopper in self.stoppers)  # in order, as Tune's
            decision = TrialScheduler.STOP if stopped else self.scheduler.on_trial_result(controller, member, flat)
            if decision != TrialScheduler.STOP and not read.finished:
                self.searcher.on_trial_result(member.trial_id, flat)
            for callback in self.callbacks:
                callback.on_trial_result(trial=member, result=dict(record), iteration=0, trials=[])
            member.run_metadata.last_result = dict(record)
            if decision == TrialScheduler.STOP or read.finished:
                if not read.finished:
                    CheckpointStore.of_trial(self.storage, WorkerSpec.of_tune(member.config).trial.number).record_leave(
                        pack.trial_id
                    )
                self._end(pack, member, None)
        for number, error in result.get(FAILED, []):
            if (member := members.get(int(number))) is not None:
                self._end(pack, member, str(error))
        return TrialScheduler.CONTINUE if members else TrialScheduler.STOP

    def ended(self, pack_id: str, failed: bool) -> None:
        """Tune let go of the pack (``failed``: with its retries spent, the error in its error
        file): so do the members that were still training, as trials that ended so."""
        self.searcher.live.discard(pack_id)
        pack = self.packs.pop(pack_id, None)
        if pack is not None:
            for member in list(self.running.get(pack_id, {}).values()):
                self._end(pack, member, last_error(pack) if failed else None)
        self.running.pop(pack_id, None)

    def failed(self, pack: Trial) -> None:
        """The pack's worker failed: the scheduler hears of it for each member, as of a trial's
        (Tune then retries the pack, or lets go of it: :meth:`ended`)."""
        for member in self.running.get(pack.trial_id, {}).values():
            self.scheduler.on_trial_error(self.controller, member)

    def removed(self, pack: Trial) -> None:
        for member in self.running.get(pack.trial_id, {}).values():
            self.scheduler.on_trial_remove(self.controller, member)

    def _end(self, pack: Trial, member: Trial, error: str | None) -> None:
        del self.running[pack.trial_id][WorkerSpec.of_tune(member.config).trial.number]
        last = flatten_dict(dict(member.run_metadata.last_result))
        self.searcher.on_trial_complete(member.trial_id, last if M.EPOCH in last else None, error=error is not None)
        if error is None:
            self.scheduler.on_trial_complete(self.controller, member, last)
        else:
            member.config[MEMBER_ERROR] = error
            self.scheduler.on_trial_error(self.controller, member)
        for callback in self.callbacks:
            hook = callback.on_trial_complete if error is None else callback.on_trial_error
            hook(trial=member, iteration=0, trials=[])


class PackSearcher(DriverOnly, Searcher):
    """Tune's searcher for a sweep of packs: the sweep's own proposes the packs; the members'
    results (played to each member by :class:`PackScheduler`, which Tune asks first: a pack's own
    result is left to Searcher's default, which ignores it) and ends reach it through
    :class:`Members`, which hears here that Tune let go of a pack."""

    def __init__(self, members: Members) -> None:
        super().__init__()  # no metric of its own: a pack's result has none, its members' do
        self.members = members

    def suggest(self, trial_id: str) -> TuneConfig | None:
        return self.members.searcher.suggest(trial_id)  # type: ignore[no-any-return]

    def on_trial_complete(self, trial_id: str, result: TuneResult | None = None, error: bool = False) -> None:
        """Tune lets go of a pack here first (its scheduler and callbacks hear of it after)."""
        self.members.ended(trial_id, error)

    def save(self, checkpoint_path: str) -> None:
        self.members.searcher.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        pass


class PackScheduler(DriverOnly, TrialScheduler):
    """Tune's scheduler for a sweep of packs: the sweep's own (ASHA, or first in, first out)
    decides on each member; Tune stops a pack once none of its members trains on."""

    def __init__(self, members: Members) -> None:
        self.members = members

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """The members' scheduler decides on the objective (Tune's own metric is unset: a pack's
        result has none)."""
        searcher = self.members.searcher
        return self.members.scheduler.set_search_properties(searcher.metric, searcher.mode, **spec)  # type: ignore[no-any-return]

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        self.members.added(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: TuneResult) -> str:
        return self.members.result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: TuneResult) -> None:
        pass  # the members ended as their results came, or as the searcher heard the pack end

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        self.members.failed(trial)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        self.members.removed(trial)

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        return self.members.scheduler.choose_trial_to_run(tune_controller)  # type: ignore[no-any-return]

    def debug_string(self) -> str:
        return str(self.members.scheduler.debug_string())


class PackCallback(DriverOnly, tune.Callback):
    """Tune's callback for a sweep of packs: a pack's start and recovery reach the sweep's
    callbacks once per member (its results through :class:`PackScheduler`, its end through
    :class:`PackSearcher`)."""

    def __init__(self, members: Members) -> None:
        self.members = members

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.members.started(trial, iteration=iteration, trials=trials, **info)

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.members.recovered(trial, iteration=iteration, trials=trials, **info)
