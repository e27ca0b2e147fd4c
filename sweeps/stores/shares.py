"""The cluster's one policy for trial slots: how many trials each sweep may run now.

A pure function of typed records (the sweeps' claims, the users' quotas, the cluster's capacity),
so that every driver, reading the same queue (:mod:`sweeps.stores.queue`), reaches the same
division, and the tests check it without a cluster. Ray still places every trial; this only says
how many each sweep may have placed.

The division, by progressive filling one trial at a time (the max-min fair share of Demers,
Keshav and Shenker, weighted, as Determined's fair-share scheduler divides slots):

- strict priority: a higher priority's sweeps are filled before a lower one's get anything; a
  lower one gets what they leave (their ceilings, quotas or trials' shapes leave room: backfill);
- among one priority, the next trial goes to the sweep holding the fewest slots per weight (ties:
  the earlier arrival), so equal sweeps hold equal shares;
- a sweep never gets more than its ``demand`` (its ceiling, ``max_concurrent``, or fewer where it
  has fewer trials left), its user's quota in CPUs and GPUs, or what the cluster has left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Why a sweep holds fewer slots than it asks for (Share.why)
PRIORITY, FAIR, QUOTA, CAPACITY = "higher priority", "fair share", "quota", "capacity"


@dataclass(frozen=True)
class Capacity:
    """The cluster's CPUs and GPUs for trials, all its alive nodes together."""

    cpus: float
    gpus: float = 0.0


@dataclass(frozen=True)
class Quota:
    """The most a user's sweeps hold at once, in CPUs and GPUs (None: no limit)."""

    cpus: float | None = None
    gpus: float | None = None


@dataclass(frozen=True)
class Claim:
    """A sweep that asks for slots: who, how urgent, how many trials it could run, each one's shape."""

    sweep: str  # its Optuna study's name: unique on the cluster's database
    user: str
    priority: int
    demand: int  # the trials it could run now: its ceiling, or fewer where fewer are left
    cpus: float  # per trial
    gpus: float = 0.0
    weight: float = 1.0
    arrived: float = 0.0  # when it first asked, for ties (seconds since the epoch)


@dataclass(frozen=True)
class Share:
    """What the policy gives one sweep: ``slots`` trials at once, and why not more (None: it has all it asks)."""

    slots: int
    why: str | None = None


def allocate(
    claims: Iterable[Claim], capacity: Capacity, quotas: Mapping[str, Quota] | None = None
) -> dict[str, Share]:
    """Each claim's share, by its sweep: strict priority, then weighted fair share, within each
    sweep's demand, its user's quota and the cluster's capacity.

    >>> a, b = Claim("a", "ann", 0, 4, 1.0), Claim("b", "bob", 0, 4, 1.0, arrived=1.0)
    >>> {k: s.slots for k, s in allocate([a, b], Capacity(4)).items()}
    {'a': 2, 'b': 2}
    """
    claims = sorted(claims, key=lambda c: (-c.priority, c.arrived, c.sweep))
    quotas = quotas or {}
    slots = {c.sweep: 0 for c in claims}
    left = [capacity.cpus, capacity.gpus]
    held: dict[str, list[float]] = {}  # by user: CPUs and GPUs

    def room(c: Claim) -> bool:
        return c.cpus <= left[0] + 1e-9 and c.gpus <= left[1] + 1e-9

    def within_quota(c: Claim) -> bool:
        quota, used = quotas.get(c.user, Quota()), held.get(c.user, [0.0, 0.0])
        return (quota.cpus is None or used[0] + c.cpus <= quota.cpus + 1e-9) and (
            quota.gpus is None or used[1] + c.gpus <= quota.gpus + 1e-9
        )

    for priority in sorted({c.priority for c in claims}, reverse=True):
        group = [c for c in claims if c.priority == priority]
        while True:
            open_ = [c for c in group if slots[c.sweep] < c.demand and room(c) and within_quota(c)]
            if not open_:
                break
            chosen = min(open_, key=lambda c: slots[c.sweep] / c.weight)  # stable: the earlier arrival on ties
            slots[chosen.sweep] += 1
            left[0] -= chosen.cpus
            left[1] -= chosen.gpus
            used = held.setdefault(chosen.user, [0.0, 0.0])
            used[0] += chosen.cpus
            used[1] += chosen.gpus
    return {c.sweep: Share(slots[c.sweep], _why(c, slots, claims, within_quota(c))) for c in claims}


def _why(claim: Claim, slots: dict[str, int], claims: list[Claim], within_quota: bool) -> str | None:
    if slots[claim.sweep] >= claim.demand:
        return None
    if not within_quota:
        return QUOTA
    if any(c.priority > claim.priority and slots[c.sweep] for c in claims):
        return PRIORITY
    if any(c.priority == claim.priority and c.sweep != claim.sweep and slots[c.sweep] for c in claims):
        return FAIR
    return CAPACITY
