"""How long a sweep has left while it runs (a line of `seqae sweep status`, :meth:`seqae.api.Sweep.eta`),
and the arithmetic it shares with the forecast before it runs (:mod:`sweeps.results.plan`).

**Epochs a trial is expected to train.** Without a scheduler, ``train.epochs`` (patience can only
shorten it). Under ASHA with rungs at ``grace_period x factor^k`` epochs, a trial trains to the
first rung, 1 in ``factor`` of those goes on to the next, and so on to ``train.epochs``
(:func:`asha_epochs`); a trial that has trained ``done`` epochs and still runs has passed every rung
up to it, so the same sum from ``done`` is what it has left. Hyperband is ASHA in brackets whose
first rung comes ``factor^b`` times later, a trial's bracket drawn with Ray's odds (more trials
to the brackets with more rungs). Racing the incumbent counts as ASHA, an upper bound: at a rung
it lets on only the best so far, a trial ASHA would let on too. A starting point (``start:``)
trains to the end.

**Wall time** at ``slots`` trials at once: the trials' time shared evenly, never less than the
longest trial's (:func:`wall_seconds`).

**The ETA** (:func:`eta`) uses the sweep's own epochs: seconds per epoch so far (every record's
seconds over the epochs they cover) and, once a trial has ended, each ended trial's time outside
its epochs (its Optuna start to end less its epochs' seconds: its worker's start, checkpoints,
MLflow), for the expected epochs left of each running trial and of the trials to come, over the
slots it runs at (:func:`granted`): the share the cluster's queue gives it now, at most its
``max_concurrent`` (as `seqae sweep set` last left it); its ``max_concurrent`` where no driver of it
is in the queue. It reads the study, the trials' records and the queue only: no PyTorch, MLflow or
Ray.

**The queue's ETA.** While a sweep's driver runs, :func:`publishing` writes this same ETA into the
sweep's row of the queue every :data:`PUBLISH_SECONDS`, as the time it expects the sweep to end:
`seqae cluster queue` shows every running sweep's from the queue alone, wherever its workspace is."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.config import build
from seqae_core.records import RecordStore, TrialProgress
from sweeps.spec.sections import SchedulerSection
from sweeps.spec.sweep import trial_layers
from sweeps.stores.queue import Queue
from sweeps.stores.search import read_only
from sweeps.stores.shares import Share
from sweeps.stores.study_trials import FINAL
from sweeps.stores.workspace import SweepState, Workspace

log = logging.getLogger(__name__)
PUBLISH_SECONDS = 15.0  # how often a running driver writes its sweep's ETA into the queue


def asha_epochs(max_t: float, grace: float, factor: int, done: float = 0.0) -> float:
    """Expected epochs still to train of a trial under ASHA (rungs at ``grace x factor^k`` below
    ``max_t``) that has trained ``done`` epochs and goes on: a 1/factor share goes on at each rung.
    ``asha_epochs(3, 1, 2) == 1 + 1/2 + 1/4``."""
    rungs = [
        r for r in itertools.takewhile(lambda r: r < max_t, (grace * factor**k for k in itertools.count())) if r > done
    ]
    epochs, share, at = 0.0, 1.0, done
    for rung in [*rungs, max_t]:
        epochs += share * (rung - at)
        share, at = share / factor, rung
    return epochs


def expected_epochs(scheduler: SchedulerSection, max_t: int, done: float = 0.0, start: bool = False) -> float:
    """Expected epochs still to train of a trial of ``max_t`` epochs that has trained ``done`` and
    goes on, under ``scheduler`` (the module's docstring); a starting point trains to the end."""
    if scheduler.type == "none" or start:
        return max(0.0, max_t - done)
    grace, factor = scheduler.grace_period, scheduler.reduction_factor
    if scheduler.type in ("asha", "race"):  # the race: ASHA's, an upper bound (the module's docstring)
        return asha_epochs(max_t, grace, factor, done)
    brackets = scheduler.brackets(max_t)
    # Ray's AsyncHyperBand: bracket s has int(log(max_t / grace) / log(factor) - s + 1) rungs, and odds exp(rungs)
    sizes = np.array([int(math.log(max_t / grace) / math.log(factor) - s + 1) for s in range(brackets)])
    odds = np.exp(sizes - sizes.max())
    odds /= odds.sum()
    return float(sum(p * asha_epochs(max_t, grace * factor**s, factor, done) for s, p in enumerate(odds)))


def wall_seconds(trial_seconds: list[float], slots: int) -> float:
    """The trials' time on ``slots`` at once: their sum shared evenly, never less than the longest."""
    return max(sum(trial_seconds) / slots, max(trial_seconds, default=0.0))


def granted(share: Share | None, ceiling: int, trials_left: int) -> tuple[int, str]:
    """The trials a sweep runs at once, for its ETA, and what set them: its ``share`` of the
    cluster's slots now (None: no driver of it is in the queue), at most its ``ceiling``
    (``max_concurrent``) and its ``trials_left``; without a share, its ceiling (at least 1).

    >>> granted(Share(1, "fair share"), 4, 10)
    (1, "the queue's share: fair share")
    >>> granted(None, 4, 2)
    (2, 'max_concurrent')
    """
    if share is None:
        return max(1, min(ceiling, trials_left)), "max_concurrent"
    slots = min(share.slots, ceiling, trials_left)
    return slots, "the queue's share" + (f": {share.why}" if share.why and slots < trials_left else "")


def seconds_left(work_seconds: float, longest_seconds: float, slots: int) -> float | None:
    """A sweep's time left: its trials' ``work_seconds`` shared among ``slots`` at once, never less
    than its longest running trial's; None while it holds no slot (it waits for the queue).

    >>> seconds_left(100.0, 10.0, 4), seconds_left(100.0, 40.0, 4), seconds_left(100.0, 10.0, 0)
    (25.0, 40.0, None)
    """
    return max(work_seconds / slots, longest_seconds) if slots else None


@dataclass(frozen=True)
class Eta:
    """A running sweep's time left, from its own epochs (the module's docstring). ``seconds_left``
    is None until an epoch has ended."""

    seconds_per_epoch: float | None  # the mean of every epoch recorded
    overhead_per_trial: float | None  # an ended trial's time outside its epochs, on average; None before one ends
    epochs_done: float
    epochs_left: float  # expected
    trials_left: int  # running and to come
    running: int
    slots: int  # trials at once (:func:`granted`)
    seconds_left: float | None
    slots_from: str = "max_concurrent"

    def line(self) -> str:
        if self.trials_left == 0:
            return "ETA: nothing left to run"
        if self.slots == 0:
            return (
                f"ETA: none while the cluster's queue gives it no slot ({self.trials_left} trials left, "
                f"{self.slots_from})"
            )
        if self.seconds_left is None:
            return f"ETA: after the first epoch ends ({self.trials_left} trials left)"
        trials = "1 trial" if self.trials_left == 1 else f"{self.trials_left} trials"
        return (
            f"ETA: {M.duration_text(self.seconds_left)} left: {trials} ({self.running} running), "
            f"{self.epochs_left:.1f} epochs expected at {self.seconds_per_epoch:.1f} s each, "
            f"{self.slots} at once ({self.slots_from})"
        )


def eta(state: SweepState, total: int | None = None) -> Eta:
    """Sweep ``state``'s time left, read from its study and its trials' records; ``total``: its
    trials, if not ``state.total_trials``."""
    spec = state.spec
    total = state.total_trials if total is None else total
    study = read_only(spec, state.backends.optuna_storage, state.study_name)
    trials = study.trials()
    progress = RecordStore.progress_of(state.backends.storage, [t.number for t in trials])
    max_t = build(trial_layers(spec.source, spec.base, {})).train.epochs
    epoch_seconds = [float(h[M.EPOCH_SECONDS]) for p in progress.values() if p for h in p.history]
    # an epoch record's seconds are per validation: an epoch's are the sum over its validations
    per_epoch = sum(epoch_seconds) / sum(_epochs(p) for p in progress.values()) if epoch_seconds else None
    overheads = []
    left, running, done = 0.0, 0, 0.0
    for trial in trials:
        p = progress[trial.number]
        trained = _epochs(p)
        done += trained
        if trial.state in FINAL:
            if trial.datetime_start and trial.datetime_complete and p:
                span = (trial.datetime_complete - trial.datetime_start).total_seconds()
                overheads.append(max(0.0, span - sum(float(h[M.EPOCH_SECONDS]) for h in p.history)))
            continue
        running += 1
        left += expected_epochs(spec.scheduler, max_t, trained, bool(trial.user_attrs.get(N.START)))
    to_come = max(0, total - len(trials))
    starts_to_come = max(0, min(len(spec.start), total) - len(trials))
    left += starts_to_come * max_t + (to_come - starts_to_come) * expected_epochs(spec.scheduler, max_t)
    trials_left = running + to_come
    slots, slots_from = granted(_share(state), study.control().max_concurrent or spec.max_concurrent, trials_left)
    overhead = float(np.mean(overheads)) if overheads else None
    seconds = None
    if per_epoch is not None:
        work = left * per_epoch + (to_come * overhead if overhead is not None else 0.0)
        longest = (
            max(
                (
                    expected_epochs(spec.scheduler, max_t, _epochs(progress[t.number]), bool(t.user_attrs.get(N.START)))
                    for t in trials
                    if t.state not in FINAL
                ),
                default=0.0,
            )
            * per_epoch
        )
        seconds = seconds_left(work, longest, slots) if trials_left else 0.0
    return Eta(per_epoch, overhead, done, left, trials_left, running, slots, seconds, slots_from)


def _share(state: SweepState) -> Share | None:
    """Sweep ``state``'s share of the cluster's slots now; None where no driver of it is in the queue."""
    return Queue(state.backends.optuna_storage, create=False).shares().get(state.study_name)


@contextlib.contextmanager
def publishing(workspace: Workspace, name: str) -> Iterator[None]:
    """While the body runs sweep ``name``'s driver, write its ETA into the queue every
    :data:`PUBLISH_SECONDS`, from a thread of its own: Ray Tune's loop never waits while it reads the
    study and every trial's records."""
    stop = threading.Event()
    thread = threading.Thread(target=_publish, args=(workspace, name, stop), name="seqae-eta", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(PUBLISH_SECONDS)  # an estimate under way against a database that does not answer is left behind


def _publish(workspace: Workspace, name: str, stop: threading.Event) -> None:
    warned = False
    while not stop.wait(PUBLISH_SECONDS):
        try:
            if not workspace.exists(name):
                continue
            state = workspace.read(name)
            queue = Queue(state.backends.optuna_storage, create=False)
            entry = queue.entry(state.study_name)
            if entry is None or entry.ended is not None:  # its driver has not joined the queue yet, or has left it
                continue
            found = eta(state)
            queue.set_eta(state.study_name, None if found.seconds_left is None else time.time() + found.seconds_left)
        except Exception as exc:  # noqa: BLE001 - the ETA is advice: a failed estimate never ends the sweep
            if not warned:
                log.warning("seqae: the sweep's ETA was not written to the queue (%s); the sweep goes on", exc)
            warned = True


def _epochs(progress: TrialProgress | None) -> float:
    """Epochs a trial's records say it trained."""
    return float(progress.epoch) if progress else 0.0
