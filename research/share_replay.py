"""``python -m research.share_replay``: several users' sweeps sharing one cluster's trial slots under three
policies, replayed on the evidence table.

**The cluster** (:data:`SLOTS` one-CPU trial slots) runs six sweeps at once, submitted together:
the evidence table's three latent fractions, two search seeds each, every one ASHA with random
search as ``python -m research.replay`` replays it (``replay.Proposals`` over the table's grid, the service's
``ResumableASHA`` with the quickstart's grace 1 and factor 2, a trial's epoch costing the table's
process CPU-seconds on its slot). In replay ``r``, the ``j``-th sweep (fractions ascending) draws
with sampler seed ``6r + j``; the ``k``-th (0 or 1) of a fraction pays the costs of training seed
``E.SEEDS[k]``'s table and aims at the targets of the other seed's (the replay's cross-fitting). Each sweep has its own budget,
:data:`SWEEP_BUDGET` of its grid's cost: it starts no trial once it has spent it, and ends when its
last trial does. ``max_concurrent`` is every sweep's ceiling, all :data:`SLOTS` slots, not its claim.
A slot is handed out when a trial ends (at the start, one at a time); a trial keeps its slot
until ASHA stops it or it reaches the last epoch.

**The policies** (the sweep that gets the next free slot, among those with budget left):

- ``first-come``: the earliest submitted (the six in an order the replay seed shuffles), as
  today's cluster does: a sweep takes every slot it can until it has spent its budget.
- ``fair``: weighted fair share, every weight 1: the sweep holding the fewest slots, ties to the earliest.
- ``fair-least-used`` (added later: see the deviation below): as ``fair``, ties to the sweep that
  has used the fewest slot-seconds, then the earliest.
- ``value``: the sweep whose own results predict the largest gain per slot-hour. A sweep with
  fewer than :data:`VALUE_MIN_TRIALS` ended trials comes first (it has no evidence yet; ties as
  ``fair``). Otherwise, with ``y`` each ended trial's best validation accuracy (a pruned trial's
  at the rung that stopped it), ``mu`` and ``sigma`` their mean and standard deviation (``ddof=1``,
  at least :data:`VALUE_MIN_SIGMA`) and ``b`` the sweep's incumbent (its best validation accuracy
  of any epoch so far): the expected improvement of one more trial over the incumbent under a
  normal fit, ``EI = sigma * (z * Phi(z) + phi(z))`` with ``z = (mu - b) / sigma``, divided by the
  slot-hours a trial of that sweep has taken on average (its ended trials' CPU-seconds / 3600).
  Ties go to the fewest slots held, then the earliest. Nothing of it reads the targets.

**Measured, per replay**: each sweep's time to its own p90 target (the cluster's wall seconds since
the submission until an epoch reaching it ends; a sweep that spends its budget without reaching it
counts the time its last trial ended, and the share reached is reported), their mean over the six;
and the sum of the six sweeps' simple regrets (the cost table's best test accuracy minus the test
accuracy of what the sweep would return, as ``replay`` scores it; a sweep with no epoch ended
returns a configuration at random, the table's mean) at :data:`REGRET_AT` of the cluster-hours all
six budgets take (that share of their sum, divided by :data:`SLOTS`, in wall seconds).

**Registered target** (fixed before the first replay; one replay of seed 7, the code's debugging,
ran before it): over each seed set (0-999 and 1000-1999, or the part of it that was replayed, said),
the value policy's median over replays of the mean time to p90 is at most 0.8x fair share's, the
upper bound of its paired bootstrap 95% interval (``intervals.paired_ratio_interval``, the replays
resampled with both policies' values) below 1.0; and its summed regret is no worse than fair
share's: the 95% bootstrap interval's upper bound of the mean difference (value minus fair, by
replay; ``intervals.bootstrap_mean``) at most +0.25 points.

**Deviation, added after the first replays** (the three registered policies' replays 0-249 had
run, and 1000-1249's were running; the registered target and its verdict are unchanged): ``fair``
as registered breaks its ties to the earliest
submitted, and with fewer slots than sweeps a freed slot's sweep, holding none again, ties with the
sweeps still waiting and wins whenever it was submitted before them: the last two submitted
wait until the others' budgets run out (in a third of the replays a sweep had no trial at the
regret's cluster-hours). That is not what a fair share means. ``fair-least-used`` breaks the tie
by the slot-seconds each sweep has used (its ended epochs'), then the earliest; the value
policy's ratio and regret against it are reported beside, as an analysis after the fact, not as
the registered target.

**Not modelled**: preemption (a slot changes hands only when a trial ends; ASHA+random's trials
are mostly one or two epochs), the policy's own overhead, and arrivals spread over time.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
from scipy.stats import norm

from research import TABLES, command
from research import evidence_table as E
from research import replay as R
from research.intervals import bootstrap_mean, paired_ratio_interval, wilson
from seqae_core import metrics as M

SLOTS = 4  # the local cluster: two workers of two CPUs
POLICIES = ("first-come", "fair", "value", "fair-least-used")  # the last added after the first replays (the docstring)
SWEEP_BUDGET = 0.5  # of a sweep's grid cost
REGRET_AT = 0.5  # of the cluster-hours all six budgets take
TARGET = 1  # index into replay.TARGET_PERCENTILES: p90
VALUE_MIN_TRIALS = 2
VALUE_MIN_SIGMA = 1e-6
METHOD = next(m for m in R.METHODS if m.name == "asha+random")
# The registered target (see the docstring).
TARGET_RATIO, TARGET_RATIO_HIGH, REGRET_MARGIN = 0.8, 1.0, 0.25


@dataclass
class Sweep:
    """One user's sweep in a share replay, and what the policies read of it."""

    name: str
    table: list[R.Curve]
    target: float
    budget: float  # CPU-seconds
    proposals: R.Proposals  # the sweep's searcher; its scheduler: proposals.simulation
    best_test: float
    random_test: float  # what a configuration picked at random scores on average
    held: int = 0
    started: int = 0
    closed: float = 0.0  # CPU-seconds of ended epochs
    running: dict[int, float] = field(default_factory=dict)  # trial number: its epoch's start
    ended: list[tuple[float, float]] = field(default_factory=list)  # each ended trial's best validation, CPU-seconds
    incumbent: float = -math.inf
    kept: dict[int, tuple[float, float]] = field(default_factory=dict)  # as replay's: best validation, its test
    reached: float = math.inf  # wall seconds to the target
    last_end: float = 0.0

    def spent(self, now: float) -> float:
        return self.closed + sum(now - since for since in self.running.values())

    def returns(self) -> float:
        return max(self.kept.values(), key=lambda k: k[0])[1] if self.kept else self.random_test

    def value(self) -> float:
        """Predicted gain in validation accuracy per slot-hour (the docstring's ``value``)."""
        if len(self.ended) < VALUE_MIN_TRIALS:
            return math.inf
        y = np.array([v for v, _ in self.ended])
        sigma = max(float(y.std(ddof=1)), VALUE_MIN_SIGMA)
        z = (float(y.mean()) - self.incumbent) / sigma
        improvement = sigma * (z * norm.cdf(z) + norm.pdf(z))
        return float(improvement / (np.mean([c for _, c in self.ended]) / 3600))


@dataclass(frozen=True)
class Outcome:
    """One policy's replay of the six sweeps."""

    policy: str
    seed: int
    times: tuple[float, ...]  # wall seconds to each sweep's p90 (its end if unreached)
    reached: tuple[bool, ...]
    regrets: tuple[float, ...]  # points, at REGRET_AT of the cluster-hours


def choose(policy: str, candidates: list[Sweep], order: list[Sweep]) -> Sweep:
    """The sweep among ``candidates`` that ``policy`` gives the next free slot; ``order``: submission order."""
    if policy == "first-come":
        return min(candidates, key=order.index)
    if policy == "fair":
        return min(candidates, key=lambda s: (s.held, order.index(s)))
    if policy == "fair-least-used":
        return min(candidates, key=lambda s: (s.held, s.closed, order.index(s)))
    return min(candidates, key=lambda s: (-s.value(), s.held, order.index(s)))


def sweeps_for(tables: dict[float, dict[int, list[R.Curve]]], seed: int) -> list[Sweep]:
    """The six sweeps of replay ``seed``, in the order of (fraction, search seed)."""
    out: list[Sweep] = []
    for fraction in sorted(tables):
        for k, (cost_seed, target_seed) in enumerate(zip(E.SEEDS, reversed(E.SEEDS))):
            table = tables[fraction][cost_seed]
            sampler_seed = 6 * seed + len(out)  # each user's own: no two sweeps propose alike
            simulation = R.simulation(METHOD, sampler_seed, len(table[0].val))
            out.append(
                Sweep(
                    f"{fraction:g}/{k}",
                    table,
                    R.targets_for(tables[fraction][target_seed])[TARGET],
                    SWEEP_BUDGET * sum(sum(c.cpu) for c in table),
                    R.Proposals(table, simulation),
                    max(c.test[-1] for c in table),
                    float(np.mean([c.test[-1] for c in table])),
                )
            )
    return out


def share(tables: dict[float, dict[int, list[R.Curve]]], policy: str, seed: int, slots: int = SLOTS) -> Outcome:
    """Replay the six sweeps of ``seed`` on ``slots`` slots under ``policy``."""
    sweeps = sweeps_for(tables, seed)
    order = list(sweeps)
    np.random.default_rng(seed).shuffle(order)  # type: ignore[arg-type]
    regret_at = REGRET_AT * sum(s.budget for s in sweeps) / slots
    regrets: list[float] | None = None
    events: list[tuple[float, int, int, int, int]] = []  # (ends at, tie-break, sweep, trial, epoch)
    trials: dict[tuple[int, int], tuple[R.Curve, Any]] = {}
    counter = itertools.count()

    def run_epoch(now: float, i: int, number: int, epoch: int) -> None:
        sweeps[i].running[number] = now
        curve = trials[(i, number)][0]
        heapq.heappush(events, (now + curve.cpu[epoch - 1], next(counter), i, number, epoch))

    def hand_out(now: float) -> None:
        """A slot to the sweep ``policy`` chooses, if one has budget left."""
        candidates = [s for s in sweeps if s.spent(now) < s.budget and s.held < slots]
        if not candidates:
            return
        sweep = choose(policy, candidates, order)
        i = sweeps.index(sweep)
        ((curve, handle),) = sweep.proposals.ask()
        number = sweep.started
        sweep.started += 1
        sweep.proposals.simulation.start(number)
        trials[(i, number)] = (curve, handle)
        sweep.held += 1
        run_epoch(now, i, number, 1)

    for _ in range(slots):
        hand_out(0.0)
    while events:
        now, _, i, number, epoch = heapq.heappop(events)
        if regrets is None and now >= regret_at:  # what had ended before
            regrets = [100 * (s.best_test - s.returns()) for s in sweeps]
        sweep = sweeps[i]
        curve, handle = trials[(i, number)]
        del sweep.running[number]
        sweep.closed += curve.cpu[epoch - 1]
        value = curve.val[epoch - 1]
        sweep.incumbent = max(sweep.incumbent, value)
        if value > sweep.kept.get(number, (-math.inf, math.nan))[0]:
            sweep.kept[number] = (value, curve.test[epoch - 1])
        if value >= sweep.target and sweep.reached == math.inf:
            sweep.reached = now
        handle.report(value, epoch)
        stop = sweep.proposals.simulation.result(number, {M.EPOCH: epoch, M.VAL_TOKEN_ACCURACY: value})
        if epoch < len(curve.val) and not stop:
            run_epoch(now, i, number, epoch + 1)
            continue
        sweep.ended.append((max(curve.val[:epoch]), sum(curve.cpu[:epoch])))
        sweep.held -= 1
        sweep.last_end = now
        if epoch < len(curve.val):
            sweep.kept.pop(number, None)
            sweep.proposals.study.tell(handle, state=optuna.trial.TrialState.PRUNED)
        else:
            sweep.proposals.study.tell(handle, max(curve.val))
        hand_out(now)
    if regrets is None:  # every budget was spent before the regret's cluster-hours
        regrets = [100 * (s.best_test - s.returns()) for s in sweeps]
    return Outcome(
        policy,
        seed,
        tuple(s.reached if s.reached < math.inf else s.last_end for s in sweeps),
        tuple(s.reached < math.inf for s in sweeps),
        tuple(regrets),
    )


def summarize(outcomes: list[Outcome]) -> list[command.Row]:
    """A row per policy: the mean time to p90 (median over replays, with its ratio to fair share's
    and to ``fair-least-used``'s), the share of sweeps reaching it, the summed regret (with its
    difference to fair share's and to ``fair-least-used``'s); and the registered target's verdict."""
    by_policy = {p: sorted((o for o in outcomes if o.policy == p), key=lambda o: o.seed) for p in POLICIES}
    by_policy = {p: mine for p, mine in by_policy.items() if mine}
    rows: list[command.Row] = []
    for policy, mine in by_policy.items():
        times = [float(np.mean(o.times)) for o in mine]
        reached = wilson(sum(sum(o.reached) for o in mine), sum(len(o.reached) for o in mine))
        regret = bootstrap_mean([sum(o.regrets) for o in mine])
        row: command.Row = {
            "policy": policy,
            "replays": len(mine),
            "slots": SLOTS,
            "mean_s_to_p90_median": f"{np.median(times):.0f}",
            "p90_reached": f"{reached.estimate:.1%} [{reached.low:.1%}, {reached.high:.1%}]",
            "summed_regret_points": f"{regret.estimate:.2f} [{regret.low:.2f}, {regret.high:.2f}]",
        }
        for versus, label in (("fair", "fair"), ("fair-least-used", "least_used")):
            theirs = by_policy.get(versus)
            if theirs is None:
                continue
            assert [o.seed for o in mine] == [o.seed for o in theirs], "paired by replay seed"
            ratio = paired_ratio_interval(times, [float(np.mean(o.times)) for o in theirs])
            gap = bootstrap_mean([sum(o.regrets) - sum(t.regrets) for o, t in zip(mine, theirs)])
            row[f"vs_{label}"] = ratio.ratio()
            row[f"regret_minus_{label}"] = f"{gap.estimate:+.2f} [{gap.low:+.2f}, {gap.high:+.2f}]"
            if policy == "value" and versus == "fair":
                met = ratio.estimate <= TARGET_RATIO and ratio.high < TARGET_RATIO_HIGH and gap.high <= REGRET_MARGIN
                row["registered_target"] = "met" if met else "missed"
        rows.append(row)
    return rows


def write_outcomes(path: Path, outcomes: list[Outcome]) -> None:
    R.write_rows(
        path,
        [
            {
                "method": o.policy,
                "seed": o.seed,
                **{f"time_{k}": t for k, t in enumerate(o.times)},
                **{f"reached_{k}": r for k, r in enumerate(o.reached)},
                **{f"regret_{k}": g for k, g in enumerate(o.regrets)},
            }
            for o in outcomes
        ],
    )


def read_outcomes(path: Path, seeds: range) -> list[Outcome]:
    """The replays of ``seeds`` a file holds (:func:`write_outcomes`)."""
    rows = pd.read_parquet(path)
    rows = rows[rows.seed.isin(seeds)].to_dict("records")
    n = sum(1 for key in (rows[0] if rows else {}) if str(key).startswith("time_"))
    return [
        Outcome(
            row["method"],
            int(row["seed"]),
            tuple(float(row[f"time_{k}"]) for k in range(n)),
            tuple(bool(row[f"reached_{k}"]) for k in range(n)),
            tuple(float(row[f"regret_{k}"]) for k in range(n)),
        )
        for row in rows
    ]


def run(seeds: range, table_path: Path = E.TABLE, folder: Path = TABLES, part: int = 50) -> list[command.Row]:
    """Replay the three policies from ``seeds``; the replays are written to
    ``folder/share-replay-seeds-<first>-<last>.parquet`` every ``part`` seeds, and a rerun replays
    only what that file lacks (the replays run in resumable parts)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tables = R.tables_at(set(E.FRACTIONS), table_path)
    out = folder / f"share-replay-seeds-{seeds.start}-{seeds.stop - 1}.parquet"
    done = read_outcomes(out, seeds) if out.exists() else []
    for policy in POLICIES:
        have = {o.seed for o in done if o.policy == policy}
        missing = [s for s in seeds if s not in have]
        for first in range(0, len(missing), part):
            done += [share(tables, policy, seed) for seed in missing[first : first + part]]
            write_outcomes(out, done)
    return summarize(done)


def main(argv: list[str] | None = None) -> None:
    args = command.parser("share_replay", __doc__, "seeds").parse_args(argv)
    command.show(run(command.seeds(args.seeds)), args.out)


if __name__ == "__main__":
    command.main(main)
