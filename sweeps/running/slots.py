"""A sweep's seat in the cluster's queue (:mod:`sweeps.stores.queue`), held by its driver: it
joins the queue, beats every few seconds with what its trials do in Ray Tune, and says how many
trials the cluster's policy lets it run now (:func:`sweeps.stores.shares.allocate`). The searcher
proposes no trial past it, and the scheduler pauses a trial at its next validation while the sweep
holds more (:class:`sweeps.running.schedulers.Preempting`)."""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass

import sqlalchemy.exc

from sweeps.running.progress import say
from sweeps.stores.queue import Entry, Queue
from sweeps.stores.shares import Capacity, Share

log = logging.getLogger(__name__)
EVERY_SECONDS = 2.0  # how often the driver beats and reads the division again
_none = Share(0)  # a sweep missing from the division (its row was just removed) holds nothing


@dataclass(frozen=True)
class Doing:
    """What a sweep's trials do now, in Ray Tune's terms, and what it could still run."""

    training: int  # RUNNING: placed by Ray
    waiting: int  # PENDING: proposed or resumed, waiting for a slot
    paused: int  # PAUSED: preempted, checkpointed
    demand: int  # the trials it could run now: its ceiling, or fewer where fewer are left
    done: int
    ceiling: int


class Slots:
    """Sweep ``sweep``'s seat in ``queue``: ``allowed`` is the trials it may run now."""

    def __init__(
        self,
        queue: Queue,
        sweep: str,
        user: str,
        priority: int,
        ceiling: int,
        cpus: float,
        gpus: float,
        total: int,
        done: int,
        capacity: Capacity,
        weight: float = 1.0,
    ) -> None:
        now = time.time()
        self.queue, self.sweep = queue, sweep
        self.entry = queue.join(
            Entry(
                sweep,
                user,
                priority,
                ceiling,
                min(ceiling, total - done),
                cpus,
                gpus,
                0,
                0,
                0,
                done,
                total,
                now,
                now,
                None,
                capacity.cpus,
                capacity.gpus,
                socket.gethostname(),
                os.getpid(),
                weight,
            )
        )
        self.capacity = capacity
        self.allowed = queue.shares().get(sweep, _none).slots
        self.why: str | None = None
        self.unanswered = False  # the queue's database did not answer the last beat
        self._read = now
        if self.entry.priority:
            say(f"seqae: sweep {sweep} has priority {self.entry.priority}")

    def due(self) -> bool:
        """Whether :data:`EVERY_SECONDS` have passed since the last beat."""
        return time.time() - self._read >= EVERY_SECONDS

    def update(self, doing: Doing) -> int:
        """Beat with what the trials do and read the sweep's share again; returns the trials it may
        run now. A database that does not answer keeps the last share (the study's own calls wait
        for it)."""
        self._read = time.time()
        try:
            self.queue.beat(
                self.sweep,
                training=doing.training,
                waiting=doing.waiting,
                paused=doing.paused,
                demand=doing.demand,
                done=doing.done,
                ceiling=doing.ceiling,
                cluster_cpus=self.capacity.cpus,
                cluster_gpus=self.capacity.gpus,
            )
            share = self.queue.shares().get(self.sweep, _none)
        except sqlalchemy.exc.DBAPIError as exc:
            if not self.unanswered:  # once per outage
                log.warning(
                    "the cluster's queue did not answer (%s); the sweep keeps its share of %d slots",
                    str(exc).splitlines()[0],
                    self.allowed,
                )
            self.unanswered = True
            return self.allowed
        self.unanswered = False
        if share.slots != self.allowed and doing.demand:
            because = f" ({share.why})" if share.why else ""
            say(f"seqae: the cluster's share of sweep {self.sweep}: {self.allowed} -> {share.slots} slots{because}")
        self.allowed, self.why = share.slots, share.why
        return self.allowed

    def leave(self, ended: str, done: int) -> None:
        """The driver ends: the sweep holds no slots (``ended``: complete, stopped, interrupted),
        ``done`` of its trials ended."""
        try:
            self.queue.leave(self.sweep, ended, done)
        except sqlalchemy.exc.DBAPIError as exc:  # it goes stale on its own
            log.warning("the cluster's queue did not answer (%s) as the sweep left it", str(exc).splitlines()[0])
