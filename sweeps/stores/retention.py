"""Which ended trials keep their checkpoints (a sweep file's ``checkpoints``), and the release of
the others' (:meth:`seqae_core.records.RecordStore.release`), so that a sweep's disk does not grow
by a model and its optimizer state with every trial.

A trial keeps its checkpoints while it runs and, once ended, while it is among the
``checkpoints.keep_best`` best complete trials (with several objectives, on the Pareto front):
those are what `seqae sweep extend --epochs` trains on and what the registry logs. Every other
ended trial keeps its progress, samples and metrics (what status, export, compare, MLflow and the
report read) and loses its model and optimizer state. Only the driver releases, in Tune's loop,
and only a store no worker holds: a trial a scheduler stopped may still be ending, and is released
at a later trial's end or at the session's. A failed trial keeps its checkpoints: `seqae sweep retry`
trains it again from its last good one (few trials fail, and most fail early).
"""

from __future__ import annotations

import logging

from filelock import Timeout
from optuna.trial import TrialState

from seqae_core.records import RecordStore, TrialProgress
from sweeps.stores.search import SweepStudy

log = logging.getLogger(__name__)

ENDED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


class Retention:
    """The sweep's kept trials, and the ended ones whose checkpoints are still to release."""

    def __init__(self, study: SweepStudy, storage: str, keep: int, progresses: dict[int, TrialProgress]) -> None:
        """``progresses``: the trials' records at the session's start; those not yet released are
        looked at (a driver that died may have left some)."""
        self.study, self.storage, self.keep = study, storage, keep
        self.kept: set[int] = set()
        self.pending = {number for number, progress in progresses.items() if not progress.released}
        self.released, self.freed = 0, 0  # this session's

    def settle(self, ended: int | None = None) -> None:
        """Release every ended trial outside the kept ones (``ended``: a trial that just ended);
        a trial pushed out of the kept ones by a better one is released with it."""
        if ended is not None:
            self.pending.add(ended)
        trials = self.study.trials()
        best = self.study.best(trials) if self.study.spec.multi_objective else self.study.ranked(trials)[: self.keep]
        kept = {t.number for t in best}
        self.pending |= self.kept - kept
        self.kept = kept
        states = {t.number: t.state for t in trials}
        for number in sorted(self.pending - kept):
            if states.get(number) not in ENDED:  # running again (an extend): it comes back when it ends
                self.pending.discard(number)
            elif states[number] == TrialState.FAIL:  # `seqae sweep retry` trains it on from its last good checkpoint
                self.pending.discard(number)
            elif self._release(number):
                self.pending.discard(number)

    def _release(self, number: int) -> bool:
        store = RecordStore.of_trial(self.storage, number)
        try:
            with store.exclusive(timeout=0):
                self.freed += store.release()
        except Timeout:
            log.debug("trial %d: a worker still holds its checkpoints; they are released later", number)
            return False
        self.released += 1
        return True

    def summary(self) -> str | None:
        """What this session released, in a line, if anything."""
        if not self.released:
            return None
        best = "the best trial" if self.keep == 1 else f"the {self.keep} best trials"
        kept = (
            f"the Pareto front's {len(self.kept)} trials"
            if self.study.spec.multi_objective
            else f"{best} (checkpoints.keep_best={self.keep})"
        )
        trials = "trial" if self.released == 1 else "trials"
        return (
            f"checkpoints kept for {kept}; released for {self.released} ended {trials}, {self.freed / 1e6:.1f} MB freed"
        )
