"""The cluster's queue of sweeps: two tables of seqae's own in the Optuna storage's database,
beside Optuna's (PostgreSQL on a cluster, the workspace's SQLite file locally), so that the queue
survives a driver's death and a head's restart, and needs no server of its own.

``seqae_queue`` holds a row per sweep that ran on this database: its user, priority, ceiling
(``max_concurrent``), each trial's CPUs and GPUs, its demand, what its trials are doing in Ray
Tune (training, waiting for a slot, paused by a preemption), trials done of total, when it joined,
its driver's last heartbeat and how it ended, its weight among sweeps of its priority, and when
its driver last expected it to end (:func:`sweeps.results.eta.publishing`). ``seqae_quotas`` holds
each user's quota, set by an admin. Every driver divides the slots by :func:`sweeps.stores.shares.allocate` over the sweeps whose
drivers beat (:data:`STALE_SECONDS`), so all reach the same division without talking to each other.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from seqae_errors import ConfigError
from sweeps.stores.ownership import ADMIN, actor
from sweeps.stores.shares import Capacity, Claim, Quota, Share, allocate

# A driver beats every few seconds while it runs; one not heard of for this long has died (or its
# cluster went down): its sweep holds no slots until a driver takes it up again.
STALE_SECONDS = 60.0
QUEUED, RUNNING, PREEMPTED, DONE, STOPPED = "queued", "running", "preempted", "done", "stopped"

_META = sa.MetaData()
_SWEEPS = sa.Table(
    "seqae_queue",
    _META,
    sa.Column("sweep", sa.String(512), primary_key=True),  # the Optuna study's name
    sa.Column("user", sa.String(256), nullable=False),
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("ceiling", sa.Integer, nullable=False),
    sa.Column("demand", sa.Integer, nullable=False),
    sa.Column("cpus", sa.Float, nullable=False),
    sa.Column("gpus", sa.Float, nullable=False),
    sa.Column("training", sa.Integer, nullable=False),
    sa.Column("waiting", sa.Integer, nullable=False),
    sa.Column("paused", sa.Integer, nullable=False),
    sa.Column("done", sa.Integer, nullable=False),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("arrived", sa.Float, nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=False),
    sa.Column("ended", sa.String(64)),  # how its last driver ended: complete, stopped, interrupted; None: running
    sa.Column("cluster_cpus", sa.Float, nullable=False),  # the cluster's capacity as its driver last saw it
    sa.Column("cluster_gpus", sa.Float, nullable=False),
    sa.Column("host", sa.String(256), nullable=False),  # where its driver runs, and as which process
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("weight", sa.Float, nullable=False, server_default="1"),
    sa.Column("eta_end", sa.Float),  # when its driver last expected it to end (seconds since the epoch); None: unknown
)
_QUOTAS = sa.Table(
    "seqae_quotas",
    _META,
    sa.Column("user", sa.String(256), primary_key=True),
    sa.Column("cpus", sa.Float),
    sa.Column("gpus", sa.Float),
)


@dataclass(frozen=True)
class Entry:
    """A sweep's row in the queue."""

    sweep: str
    user: str
    priority: int
    ceiling: int
    demand: int  # trials it could run now
    cpus: float  # per trial
    gpus: float
    training: int  # its trials placed by Ray and training
    waiting: int  # proposed, waiting for a slot (Tune's PENDING)
    paused: int  # preempted: checkpointed, waiting to resume
    done: int
    total: int
    arrived: float
    heartbeat: float
    ended: str | None
    cluster_cpus: float
    cluster_gpus: float
    host: str = ""
    pid: int = 0
    weight: float = 1.0  # its share among sweeps of its priority, in proportion
    eta_end: float | None = None

    def live(self, now: float) -> bool:
        """Whether its driver runs: it has not ended, beat lately, and (seen from its own host) its
        process is alive: a driver killed here frees its slots at once, not a minute later."""
        return (
            self.ended is None
            and now - self.heartbeat < STALE_SECONDS
            and not (self.host == socket.gethostname() and not _alive(self.pid))
        )

    def claim(self) -> Claim:
        return Claim(self.sweep, self.user, self.priority, self.demand, self.cpus, self.gpus, self.weight, self.arrived)


@dataclass(frozen=True)
class Place:
    """One sweep as `seqae cluster queue` shows it."""

    sweep: str
    user: str
    priority: int
    state: str  # queued, running, preempted, done, stopped (its driver ended or died)
    held: int  # slots its trials train in now
    share: int  # the slots the policy gives it now
    why: str | None  # why its share is below its demand (sweeps.stores.shares)
    quota: Quota
    trials_done: int
    trials_total: int
    waiting: int
    paused: int
    place: int | None  # 1 for the first sweep in line for slots; None: it is not waiting for any
    weight: float = 1.0
    eta_seconds: float | None = None  # its time left as its driver last estimated it, counted down since; None: unknown


def _engine_kwargs(url: str) -> dict[str, bool | dict[str, int]]:
    # as the Optuna storage connects (sweeps.stores.study_storage.open_storage)
    # a server that does not answer costs a heartbeat a few seconds, never Tune's loop a minute
    return (
        {"connect_args": {"timeout": 60}}
        if url.startswith("sqlite:")
        else {"pool_pre_ping": True, "connect_args": {"connect_timeout": 5}}
    )


@functools.cache
def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url, **_engine_kwargs(url))


class Queue:
    """The queue kept in the database at ``url`` (an Optuna storage URL); its tables are created
    unless ``create`` is false (a reader's: status writes nothing, and finds an empty queue)."""

    def __init__(self, url: str, create: bool = True) -> None:
        self.engine = _engine(url)
        if create:
            try:
                _META.create_all(self.engine, checkfirst=True)
            except sa.exc.IntegrityError:  # PostgreSQL: another driver created them in the same moment
                _META.create_all(self.engine, checkfirst=True)
            _add_columns(self.engine)
        self.kept = create or sa.inspect(self.engine).has_table(_SWEEPS.name)
        # a reader of a queue made by an earlier seqae reads the columns it has (the others: their defaults)
        have = {c["name"] for c in sa.inspect(self.engine).get_columns(_SWEEPS.name)} if self.kept else set()
        self.columns = [c for c in _SWEEPS.columns if c.name in have]

    def entries(self) -> list[Entry]:
        if not self.kept:
            return []
        with self.engine.connect() as db:
            return [Entry(**row._mapping) for row in db.execute(sa.select(*self.columns))]

    def entry(self, sweep: str) -> Entry | None:
        return next((e for e in self.entries() if e.sweep == sweep), None)

    def join(self, entry: Entry) -> Entry:
        """Enter (or, for a sweep that ran before, re-enter) the queue; a sweep re-entering keeps its
        priority (`seqae sweep priority` may have changed it) and its place by arrival."""
        before = self.entry(entry.sweep)
        if before is not None:
            entry = replace(entry, priority=before.priority, arrived=before.arrived)
        with self.engine.begin() as db:
            if before is not None:
                db.execute(sa.delete(_SWEEPS).where(_SWEEPS.c.sweep == entry.sweep))
            db.execute(sa.insert(_SWEEPS).values(**vars(entry)))
        return entry

    def beat(self, sweep: str, **fields: Any) -> None:
        """The driver's heartbeat, with what its trials do now."""
        with self.engine.begin() as db:
            db.execute(sa.update(_SWEEPS).where(_SWEEPS.c.sweep == sweep).values(heartbeat=time.time(), **fields))

    def leave(self, sweep: str, ended: str, done: int) -> None:
        self.beat(sweep, ended=ended, training=0, waiting=0, paused=0, demand=0, done=done)

    def set_eta(self, sweep: str, end: float | None) -> None:
        """When sweep ``sweep``'s driver now expects it to end (None: it cannot tell yet)."""
        with self.engine.begin() as db:
            db.execute(sa.update(_SWEEPS).where(_SWEEPS.c.sweep == sweep).values(eta_end=end))

    def forget(self, sweep: str) -> None:
        """Take a deleted sweep's row out of the queue (`seqae sweep delete`)."""
        with self.engine.begin() as db:
            db.execute(sa.delete(_SWEEPS).where(_SWEEPS.c.sweep == sweep))

    def quotas(self) -> dict[str, Quota]:
        if not self.kept:
            return {}
        with self.engine.connect() as db:
            return {r.user: Quota(r.cpus, r.gpus) for r in db.execute(sa.select(_QUOTAS))}

    def set_quota(self, user: str, quota: Quota) -> Quota:
        """An admin's: ``user``'s sweeps hold at most ``quota`` at once (None fields: no limit)."""
        if actor() != ADMIN:
            raise ConfigError(f"quotas are set by an MLflow admin ({ADMIN}); {actor()} may not set {user}'s")
        with self.engine.begin() as db:
            db.execute(sa.delete(_QUOTAS).where(_QUOTAS.c.user == user))
            db.execute(sa.insert(_QUOTAS).values(user=user, cpus=quota.cpus, gpus=quota.gpus))
        return quota

    def set_priority(self, sweep: str, priority: int) -> Entry:
        """Sweep ``sweep``'s new priority, from its owner or an admin; anyone else is refused,
        naming the owner. Its drivers take it at their next heartbeat."""
        entry = self.entry(sweep)
        if entry is None:
            raise ConfigError(f"sweep {sweep!r} is not in the cluster's queue (it has not started on this database)")
        who = actor()
        if who not in (entry.user, ADMIN):
            raise ConfigError(
                f"sweep {sweep!r} belongs to {entry.user}; {who} may not change its priority (an MLflow admin may)"
            )
        with self.engine.begin() as db:
            db.execute(sa.update(_SWEEPS).where(_SWEEPS.c.sweep == sweep).values(priority=priority))
        return replace(entry, priority=priority)

    def shares(self, entries: list[Entry] | None = None, now: float | None = None) -> dict[str, Share]:
        """Each live sweep's share of the cluster's slots now."""
        entries = self.entries() if entries is None else entries
        now = time.time() if now is None else now
        live = [e for e in entries if e.live(now)]
        return allocate([e.claim() for e in live], capacity(live), self.quotas())

    def would_grant(self, claim: Claim) -> tuple[Share, Capacity] | None:
        """The share a sweep ``claim`` would get if it joined now, and the cluster's capacity it was
        divided from (the newest heartbeat's, a running sweep's or an ended one's); None where no
        sweep ever ran here, so the queue knows no capacity."""
        entries, now = self.entries(), time.time()
        if not entries:
            return None
        live = [e for e in entries if e.live(now) and e.sweep != claim.sweep]
        cluster = capacity(live or entries)
        return allocate([*(e.claim() for e in live), claim], cluster, self.quotas())[claim.sweep], cluster

    def view(self) -> list[Place]:
        """Every sweep on the database, the running ones first by priority, then the ended ones."""
        entries, now = self.entries(), time.time()
        shares, quotas = self.shares(entries, now), self.quotas()
        in_line = sorted(
            (e for e in entries if e.live(now) and e.training == 0 and e.demand > 0),
            key=lambda e: (-e.priority, e.arrived),
        )
        places = []
        for e in sorted(entries, key=lambda e: (not e.live(now), -e.priority, e.arrived)):
            share = shares.get(e.sweep, Share(0))
            eta = max(0.0, e.eta_end - now) if e.eta_end is not None and e.live(now) else None
            # a sweep whose driver died (or whose cluster went down) holds nothing: its last beat's counts are gone
            training, waiting, paused = (e.training, e.waiting, e.paused) if e.live(now) else (0, 0, 0)
            places.append(
                Place(
                    e.sweep,
                    e.user,
                    e.priority,
                    state(e, now),
                    training,
                    share.slots,
                    share.why,
                    quotas.get(e.user, Quota()),
                    e.done,
                    e.total,
                    waiting,
                    paused,
                    in_line.index(e) + 1 if e in in_line else None,
                    e.weight,
                    eta,
                )
            )
        return places


def _add_columns(engine: sa.Engine) -> None:
    """Add the columns a queue made by an earlier seqae lacks (each nullable or with a default)."""
    have = {c["name"] for c in sa.inspect(engine).get_columns(_SWEEPS.name)}
    with engine.begin() as db:
        for column in _SWEEPS.columns:
            if column.name not in have:
                server = column.server_default
                default = f" DEFAULT {server.arg}" if isinstance(server, sa.DefaultClause) else ""
                kind = column.type.compile(engine.dialect)
                db.execute(sa.text(f'ALTER TABLE {_SWEEPS.name} ADD COLUMN "{column.name}" {kind}{default}'))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def capacity(entries: list[Entry]) -> Capacity:
    """The cluster's capacity as its drivers last saw it (the newest heartbeat's)."""
    newest = max(entries, key=lambda e: e.heartbeat, default=None)
    return Capacity(newest.cluster_cpus, newest.cluster_gpus) if newest else Capacity(0.0)


def state(entry: Entry, now: float) -> str:
    if entry.ended == "complete":
        return DONE
    if not entry.live(now):
        return STOPPED
    if entry.paused and entry.training == 0:
        return PREEMPTED
    return RUNNING if entry.training else QUEUED
