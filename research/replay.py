"""``python -m research.replay``: search methods replayed on the evidence table, with statistics.

The evidence table (``research/evidence_table.py``) holds every epoch of 96 configurations at
three latent fractions, trained from two seeds. A method is replayed against one seed's table:
the service's own Optuna sampler (TPE as ``frontier.yaml`` pins it) proposes over the table's grid,
each proposal trains the nearest configuration of the table, the service's own ASHA or asynchronous
Hyperband (the quickstart's grace 1 and factor 2) stops (both driven through
:func:`sweeps.running.simulation.simulate`), and :data:`WORKERS` asynchronous one-CPU workers take the measured
epochs' process CPU-seconds. A proposal reads only what the sweep would have known when it was
made. A warm-started method first runs the best configurations of another fraction's table, as
``warm_start`` runs an earlier sweep's (:func:`methods_at`).

**Cross-fitting.** The targets (:data:`TARGET_PERCENTILES`, registered before the table was built)
are percentiles of the configurations' best validation accuracy on one seed's table; the cost of
reaching one is read from the other seed's table, the direction alternating with the replay seed,
so the noise of a table never sets its own target (:func:`targets_for`).

**What a replay records** (:class:`Trace`): the CPU-seconds and trials at which each target is
first reached (an epoch ends with validation accuracy at or above it; the other workers' epochs in
progress count for the time they ran), and the test accuracy of the configuration it would return
after spending :data:`BUDGETS` of the grid's cost (the best validation epoch so far of a trial no
rung pruned, as the service returns, scored by its kept checkpoint's test accuracy), the grid's
cost being every configuration trained on the cost table. A replay runs until the last budget is
spent.

**Statistics** (:mod:`research.intervals`): per method and target, the median cost with its
order-statistic 95% interval (unreached replays count as infinitely costly), its ratio to the
grid's median with a bootstrap interval, the share reached with Wilson's interval, the median
trials; per method and budget, the simple regret (the cost table's best test accuracy minus the
returned one, in points) with a bootstrap interval; Kendall's tau of the first rung for the ASHA
methods.

**Targets of issue 82, registered before its first replay** (a search that learns from every
trial: ordered spaces, a model fitted on the rungs pruned trials reached, stopping that races the
incumbent). A method meets them if:

- it reaches the p90 target for at most **0.5x the grid's median CPU-seconds**, the upper bound of
  the ratio's 95% interval **below 0.6x**, on **both replay seed sets (0-999 and 1000-1999)** and
  at **2 or more of the 3 latent fractions** (12.5%, 25%, 50%);
- its simple test regret at **0.25x, 0.5x and 1x the grid's cost** is no worse than ASHA + random
  search's under the same protocol (the intervals overlap or lie below it), the returned
  configuration chosen on one training seed's table and **scored on the other seed's test values**
  (cross-seed scoring), so a method that races to a configuration that is fragile across seeds
  pays for it;
- (outside the replay) real sweeps at the quickstart's size, 10 search seeds per arm: the new
  default's best trial's test score no worse than random + ASHA's at no more cost (t intervals).
"""

from __future__ import annotations

import heapq
import itertools
import math
import multiprocessing
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import numpy as np
import optuna
import pandas as pd
from scipy.stats import kendalltau

from research import TABLES, command
from research import evidence_table as E
from research.intervals import bootstrap_mean, median_interval, ratio_interval, wilson
from seqae_core import metrics as M
from seqae_core.borders import Document
from seqae_errors import ConfigError
from sweeps.running.simulation import Simulation, simulate

WORKERS = 2
# The evidence table's targets, registered before it was built: a configuration's best validation
# accuracy at these percentiles of one training seed's table; the cost of reaching it is read from
# the other seed's table, and both ways round (cross-fitting), so no table's noise sets its own target.
TARGET_PERCENTILES = (75, 90, 97)
BUDGETS = (0.25, 0.5, 1.0)  # shares of the grid's cost at which the returned configuration is scored
FRACTION = 0.25  # the fraction replayed by default


@dataclass(frozen=True)
class Curve:
    """One configuration's training on one seed's table, epoch by epoch."""

    config_id: int
    params: E.Params
    val: tuple[float, ...]  # validation token accuracy
    test: tuple[float, ...]  # test token accuracy of the checkpoint kept by that epoch
    cpu: tuple[float, ...]  # process CPU-seconds


@dataclass(frozen=True)
class Method:
    name: str
    sampler: str  # grid (every configuration, in an order the seed shuffles), random, tpe or gp
    # or asha, or hyperband (asynchronous: ASHA in brackets), or race (ASHA's rungs racing the
    # incumbent), the service's own
    scheduler: str = "none"
    startup: int = 2  # TPE's (and the GP's) random start-up trials: 2, the quickstart's when registered
    warm_from: float | None = None  # transfer: the other fraction whose table's best configurations run first
    pack: int = 1  # trials proposed together and trained in lockstep on one worker (research.pack_replay)
    space: str = "categorical"  # or ordered: the grid's numbers declared as ordered choices (:func:`_document`)
    fresh: bool = False  # each proposal trains the nearest configuration not trained yet (no re-buying)
    # what the sampler learns from: trials, as the service tells Optuna (a complete trial's best value,
    # a pruned one's intermediate values); or first-rung, every trial complete at its value at the
    # first rung (grace period) as soon as it has one, so a pruned trial counts as much as a finished one
    model: str = "trials"


# Registered before measuring: the methods published (grid to asha+tpe), TPE's start-up at 1, 5
# and 10 random trials (Optuna's default is 10; the quickstart then had 2), and Hyperband with random
# search and with TPE (Optuna's recommended approximation of BOHB: TPE learns from every rung's
# results, the pruned trials ranked by how far they got, then by their value there).
METHODS = (
    Method("grid", "grid"),
    Method("random", "random"),
    Method("tpe", "tpe"),
    Method("asha+random", "random", "asha"),
    Method("asha+tpe", "tpe", "asha"),
    Method("asha+tpe startup 1", "tpe", "asha", startup=1),
    Method("asha+tpe startup 5", "tpe", "asha", startup=5),
    Method("asha+tpe startup 10", "tpe", "asha", startup=10),
    Method("hyperband+random", "random", "hyperband"),
    Method("hyperband+tpe", "tpe", "hyperband"),
)
# Transfer, registered likewise: a search at one fraction that starts from the best configurations
# of a search at another (a user's earlier sweep of the same model family), run first as starting
# points (to the end, as the service's warm_start runs them), against a cold start.
WARM_FROM = {0.125: 0.25, 0.25: 0.5, 0.5: 0.25}
WARM_TOP = 5  # the earlier sweep's best configurations that run first
# TPE as the studies pin it, and the quickstart's ASHA (sweeps/studies/quickstart.yaml).
TPE = {"multivariate": True, "group": True, "constant_liar": True}
GRACE_PERIOD, REDUCTION_FACTOR = 1, 2


def methods_at(fraction: float) -> tuple[Method, ...]:
    """What is replayed at ``fraction``: :data:`METHODS`, and ASHA+TPE warm-started from the
    fraction :data:`WARM_FROM` names."""
    source = WARM_FROM[fraction]
    return (*METHODS, Method(f"asha+tpe warm from {source:.1%}", "tpe", "asha", warm_from=source))


@dataclass(frozen=True)
class Trace:
    """One replay."""

    costs: tuple[float, ...]  # CPU-seconds to each target; inf: not reached within the last budget
    trials_to: tuple[float, ...]  # trials started by then; inf likewise
    returned_test: tuple[float, ...]  # the returned configuration's test accuracy at each budget
    trials: int  # trials started in all
    # the same configurations scored on another training seed's table (cross-seed scoring): the
    # test accuracy its training from that seed kept after as many epochs; empty: not scored
    returned_cross: tuple[float, ...] = ()


def curves(table: pd.DataFrame, fraction: float, seed: int) -> list[Curve]:
    """The configurations of ``table`` at ``fraction`` trained from ``seed``, by configuration."""
    rows = table[(table.latent_fraction == fraction) & (table.seed == seed)].sort_values(["config_id", "epoch"])
    return [
        Curve(
            int(config_id),
            E.CONFIGURATIONS[int(config_id)],
            tuple(group.val_token_accuracy),
            tuple(group.test_token_accuracy),
            tuple(group.cpu_seconds),
        )
        for config_id, group in rows.groupby("config_id", sort=True)
    ]


def targets_for(target_table: list[Curve]) -> tuple[float, ...]:
    """The registered targets, read from ``target_table`` only."""
    return tuple(float(np.percentile([max(c.val) for c in target_table], p)) for p in TARGET_PERCENTILES)


def _document(method: Method, seed: int, epochs: int) -> Document:
    """A sweep over the table's grid with ``method``'s sampler and scheduler, as a user would write it
    (a GP: random search's, the GP given by :func:`_own_sampler`, since the service's check refuses a
    GP over a categorical key such as the block, which Optuna's GPSampler models)."""
    search: dict[str, Document] = {k: choices(method, v) for k, v in E.GRID.items()}
    search["model.heads"]["when"] = {"model.block": "transformer"}
    tpe = {**TPE, "n_startup_trials": method.startup} if method.sampler == "tpe" else {}
    scheduler = {"type": method.scheduler, "grace_period": GRACE_PERIOD, "reduction_factor": REDUCTION_FACTOR}
    return {
        "config": {"train": {"epochs": epochs}},
        "search": search,
        "trials": {"total": 10_000},
        "sampler": {"type": "random" if method.sampler == "gp" else method.sampler, "seed": seed, **tpe},
        "scheduler": scheduler if method.scheduler != "none" else {"type": "none"},
    }


def simulation(method: Method, seed: int, epochs: int) -> Simulation:
    """The sweep's own searcher and scheduler for ``method`` (:func:`_document`)."""
    return simulate(_document(method, seed, epochs), f"replay of {method.name}", own_sampler=_own_sampler(method, seed))


def _own_sampler(method: Method, seed: int) -> optuna.samplers.BaseSampler | None:
    """For a GP, the sampler the service builds for ``sampler: {type: gp}``: Optuna's GPSampler,
    seeded likewise; else None (the service's for the sweep file)."""
    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=method.startup) if method.sampler == "gp" else None


class Proposals:
    """The sweep's searcher over the table's grid (``simulation``); each proposal trains the nearest
    configuration of the table (the table is a space-filling subset of the grid). ``first``:
    configurations proposed before the sampler's own (a warm start), in order. ``fresh``: each
    proposal trains the nearest configuration no earlier proposal trains (none once all are taken),
    and the study records it with that configuration's values, not the proposal's, so the sampler
    learns where the value was measured: the proposal's Optuna trial is failed (every sampler here
    ignores a failed trial) and the configuration is enqueued and asked in its place."""

    def __init__(
        self, table: list[Curve], simulation: Simulation, first: tuple[E.Params, ...] = (), fresh: bool = False
    ) -> None:
        self.simulation = simulation
        self.study = simulation.study
        for params in first:
            simulation.enqueue(declared(params))
        self.table = table
        self.coords = E._coordinates([c.params for c in table])
        self.fresh = fresh
        self.taken: set[int] = set()  # the configurations proposed so far (fresh)

    def ask(self, size: int = 1) -> list[tuple[Curve, optuna.Trial]]:
        """``size`` proposals, as the service fills a pack (:meth:`Simulation.ask`). Fresh: one at a
        time, none once every configuration is taken."""
        if self.fresh:
            assert size == 1, "fresh proposals are asked one at a time"
            (proposal,) = self.simulation.ask()
            trial = proposal.trial
            if len(self.taken) == len(self.table):
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                return []
            index = nearest(self.coords, proposal.params, self.taken)
            self.taken.add(index)
            if trial.params != self.simulation.recorded(declared(self.table[index].params)):
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                self.simulation.enqueue(declared(self.table[index].params))
                trial = self.simulation.ask()[0].trial
            return [(self.table[index], trial)]
        return [(self.table[nearest(self.coords, p.params)], p.trial) for p in self.simulation.ask(size)]


# Issue 82's ordered space (``Method.space == "ordered"``): every key of the grid with numeric
# choices is declared as the service's ordered choice (``type: ordered``), its sorted levels, which
# Optuna samples as an integer, the level's position (the learning rate's and the widths' levels
# are log-spaced, so the position is their log scale); the block stays a categorical choice. TPE's
# Parzen estimators and a GP's kernel then see that 1.5e-3 lies between 7e-4 and 3.5e-3 and d_model
# 64 between 32 and 128, so what one trial teaches spreads to its neighbours, which a categorical
# key cannot do, and random search still draws every level alike, as over the categorical space.
# (A log-uniform learning rate snapped to the table's levels would draw the two end levels half as
# often as the others: the table's discreteness, not the search, would set what random search tries.)
def choices(method: Method, levels: tuple[E.Level, ...]) -> dict[str, str | list[E.Level]]:
    """A grid key's distribution in ``method``'s space: its levels as an ordered choice where the
    space is ordered and they are numbers, else as a categorical one."""
    ordered = method.space == "ordered" and not any(isinstance(v, str) for v in levels)
    return (
        {"type": "ordered", "choices": sorted(levels)} if ordered else {"type": "categorical", "choices": list(levels)}
    )


def declared(params: Mapping[str, E.Level]) -> E.Params:
    """A configuration of the grid as a sweep over it proposes it: the heads only for the transformer block."""
    return {k: v for k, v in params.items() if k != "model.heads" or params["model.block"] == "transformer"}


def nearest(coords: np.ndarray, params: Mapping[str, E.Level], taken: set[int] | frozenset[int] = frozenset()) -> int:
    """The index of the table's configuration (``coords``: :func:`E._coordinates` of its
    configurations) nearest to ``params``, of those not in ``taken``."""
    point = E._coordinates([{**params, "model.heads": params.get("model.heads", 1)}])[0]
    distances = np.linalg.norm(coords - point, axis=1)
    distances[list(taken)] = np.inf
    return int(np.argmin(distances))


def warm_start(source: list[Curve], top: int = WARM_TOP) -> tuple[E.Params, ...]:
    """The ``top`` configurations of an earlier search's table, by their best validation accuracy."""
    return tuple(c.params for c in sorted(source, key=lambda c: max(c.val), reverse=True)[:top])


def replay(
    table: list[Curve],
    method: Method,
    seed: int,
    targets: tuple[float, ...],
    *,
    workers: int = WORKERS,
    budgets: tuple[float, ...] = BUDGETS,
    first: tuple[E.Params, ...] = (),
    grid_cost: float | None = None,
    score: list[Curve] | None = None,
) -> Trace:
    """Run ``method`` against ``table`` until ``budgets[-1]`` x the grid's cost is spent (a grid:
    until every configuration is trained; a fresh method: or until it has none left to propose);
    ``first``: a warm start's configurations. ``grid_cost``: every configuration of ``table``
    trained, unless the grid validates less often than ``table`` does (``research.subepoch_rungs``).
    ``score``: another training seed's table of the same configurations, on which each returned
    configuration is also scored (:attr:`Trace.returned_cross`).

    A worker runs a pack of ``method.pack`` trials at a time (one: a trial at a time), its members
    in lockstep: a pack's epoch takes the sum of its members' epochs, each member's epoch ends with
    the pack's, a stopped member leaves, and the worker proposes the next pack when the last has left."""
    assert method.pack == 1 or not first, "a warm start's enqueued trials would not share a pack's shape"
    grid_cost = sum(sum(c.cpu) for c in table) if grid_cost is None else grid_cost
    horizon = budgets[-1] * grid_cost
    epochs = len(table[0].val)
    order = list(table)
    np.random.default_rng(seed).shuffle(order)  # type: ignore[arg-type]
    # a grid has no sampler, nor scheduler
    sweep = None if method.sampler == "grid" else simulation(method, seed, epochs)
    proposals = None if sweep is None else Proposals(table, sweep, first, method.fresh)
    by_id = {c.config_id: c for c in score or ()}
    events: list[tuple[float, int, int]] = []  # (ends at, tie-break, pack number): a pack's epoch ends
    # by pack number (its first trial's): its members by trial number (curve, Optuna trial), its epoch, since when
    running: dict[int, tuple[dict[int, tuple[Curve, optuna.Trial | None]], int, float]] = {}
    counter = itertools.count()
    started, closed = 0, 0.0  # trials started; CPU-seconds of the epochs ended
    costs, trials_to = [math.inf] * len(targets), [math.inf] * len(targets)
    returned: list[tuple[float, float]] = []
    # each trial no rung pruned: its best validation, its kept checkpoint's test, its configuration, its epochs
    kept: dict[int, tuple[float, float, int, int]] = {}

    def returns() -> tuple[float, float]:
        """The test accuracy of what the sweep would return now: its best trial by validation that
        no rung pruned (the service returns no pruned trial; one still training counts, since a
        budget that stops it completes it with the epoch it kept); and that configuration's on
        ``score``, trained as long."""
        if not kept:
            return math.nan, math.nan
        _, test, config_id, trained = max(kept.values(), key=lambda k: k[0])
        return test, by_id[config_id].test[trained - 1] if by_id else math.nan

    def spent(now: float) -> float:
        return closed + sum(now - since for *_, since in running.values())

    def run_epoch(now: float, pack: dict[int, tuple[Curve, optuna.Trial | None]], epoch: int) -> None:
        running[min(pack)] = (pack, epoch, now)
        heapq.heappush(events, (now + sum(c.cpu[epoch - 1] for c, *_ in pack.values()), next(counter), min(pack)))

    def start(now: float) -> bool:
        nonlocal started
        if method.sampler == "grid":
            if started >= len(order):
                return False
            asked: list[tuple[Curve, optuna.Trial | None]] = [(c, None) for c in order[started : started + method.pack]]
        else:
            assert proposals is not None
            asked = list(proposals.ask(method.pack))
            if not asked:  # a fresh method has trained every configuration
                return False
        pack = {}
        for curve, handle in asked:
            number = started
            started += 1
            # a warm start's configurations run as the service runs them, as starting points: to the end
            if sweep is not None:
                sweep.start(number, "warm" if number < len(first) else None)
            pack[number] = (curve, handle)
        run_epoch(now, pack, 1)
        return True

    for _ in range(workers):
        start(0.0)
    while events and len(returned) < len(budgets):
        now, _, key = heapq.heappop(events)
        while len(returned) < len(budgets) and spent(now) >= budgets[len(returned)] * grid_cost:
            returned.append(returns())  # what had ended before the budget ran out
        if len(returned) == len(budgets):
            break
        pack, epoch, _ = running.pop(key)
        closed += sum(curve.cpu[epoch - 1] for curve, *_ in pack.values())
        for number, (curve, handle) in list(pack.items()):
            value = curve.val[epoch - 1]
            best, test = kept[number][:2] if number in kept else (-math.inf, math.nan)
            if value > best:
                best, test = value, curve.test[epoch - 1]
            kept[number] = (best, test, curve.config_id, epoch)
            for i, target in enumerate(targets):
                if value >= target and costs[i] == math.inf:
                    costs[i], trials_to[i] = spent(now), started
            first_rung = method.model == "first-rung"
            if handle is not None and first_rung and epoch == GRACE_PERIOD:
                proposals.study.tell(handle, value)  # type: ignore[union-attr]  # the model learns of it now
            elif handle is not None and not first_rung:
                handle.report(value, epoch)
            stop = sweep is not None and sweep.result(number, {M.EPOCH: epoch, M.VAL_TOKEN_ACCURACY: value})
            if epoch < epochs and not stop:
                continue
            del pack[number]
            if epoch < epochs:
                kept.pop(number, None)
            if proposals is not None and handle is not None and not first_rung:
                if epoch < epochs:
                    proposals.study.tell(handle, state=optuna.trial.TrialState.PRUNED)
                else:  # the value a sweep records: the best epoch's, which early stopping keeps
                    proposals.study.tell(handle, max(curve.val))
        if pack:  # the pack goes on with the members left; it takes no new one
            run_epoch(now, pack, epoch + 1)
        elif spent(now) < horizon:
            start(now)
    returned += [returns()] * (len(budgets) - len(returned))  # a grid ends at its cost exactly
    return Trace(
        tuple(costs),
        tuple(trials_to),
        tuple(r[0] for r in returned),
        started,
        tuple(r[1] for r in returned) if by_id else (),
    )


def first_rung_tau(table: list[Curve], rung: int = GRACE_PERIOD) -> float:
    """Kendall's tau between the configurations' ranking at epoch ``rung`` and by their final objective."""
    return float(kendalltau([c.val[rung - 1] for c in table], [max(c.val) for c in table])[0])


@dataclass(frozen=True)
class Run:
    """One replay of one method, with what it was measured against."""

    method: str
    seed: int
    cost_seed: int  # the training seed whose table gave the costs
    targets: tuple[float, ...]  # read from the other seed's table
    best_test: float  # the cost table's best test accuracy (of a configuration's kept checkpoint)
    trace: Trace
    best_cross: float = math.nan  # the best test accuracy of the table the returned configurations are scored on


def _one(tables: dict[int, list[Curve]], method: Method, seed: int, sources: dict[int, list[Curve]]) -> Run:
    seeds = sorted(tables)
    cost_seed, target_seed = seeds[seed % 2], seeds[1 - seed % 2]
    table = tables[cost_seed]
    targets = targets_for(tables[target_seed])
    # a warm start's earlier search ran on the other seed's table too: it never sees the cost table's noise
    first = warm_start(sources[target_seed]) if method.warm_from is not None else ()
    # cross-seed scoring: what the replay returns, chosen on the cost table, is scored on the other
    return Run(
        method.name,
        seed,
        cost_seed,
        targets,
        max(c.test[-1] for c in table),
        replay(table, method, seed, targets, first=first, score=tables[target_seed]),
        max(c.test[-1] for c in tables[target_seed]),
    )


def replays(
    tables: dict[int, list[Curve]],
    methods: tuple[Method, ...],
    seeds: range,
    workers: int = 1,
    sources: dict[int, list[Curve]] | None = None,
) -> list[Run]:
    """Every method replayed from every seed (in a pool of ``workers`` processes); ``sources``: the
    table, by seed, that warm-started methods take their first configurations from."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    jobs = [(tables, m, s, sources or {}) for m in methods for s in seeds]
    if workers <= 1:
        return [_one(*job) for job in jobs]
    with ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=optuna.logging.set_verbosity,
        initargs=(optuna.logging.WARNING,),
    ) as pool:
        return list(pool.map(_one, *zip(*jobs), chunksize=max(1, len(jobs) // (8 * workers))))


def summarize(runs: list[Run], taus: dict[int, float]) -> list[command.Row]:
    """A row per method and target (cost to it), then per method and budget (regret)."""
    by_method = {m: [r for r in runs if r.method == m] for m in dict.fromkeys(r.method for r in runs)}
    grid = by_method.get("grid")
    rows: list[command.Row] = []
    for i in range(len(TARGET_PERCENTILES)):
        for method, mine in by_method.items():
            vs_grid = (
                ratio_interval([r.trace.costs[i] for r in mine], [r.trace.costs[i] for r in grid]).ratio()
                if grid
                else ""
            )
            rows.append(
                {
                    **cost_row(mine, i, {"vs_grid": vs_grid}),
                    **(
                        {"first_rung_tau": f"{np.mean(list(taus.values())):.3f}"}
                        if method.startswith(("asha", "hyperband"))
                        else {}
                    ),
                }
            )
    rows += [regret_row(mine, j) for j in range(len(BUDGETS)) for mine in by_method.values()]
    return rows


def cost_row(mine: list[Run], i: int, versus: Mapping[str, str]) -> command.Row:
    """One method's replays' cost to target ``i``: the median with its interval, ``versus`` (a
    ratio to another method's), the share reached, the median trials."""
    costs = [r.trace.costs[i] for r in mine]
    median, share = median_interval(costs), wilson(sum(c < math.inf for c in costs), len(costs))
    return {
        "target": f"p{TARGET_PERCENTILES[i]}",
        "method": mine[0].method,
        "replays": len(mine),
        "target_value": f"{np.mean([r.targets[i] for r in mine]):.4f}",
        "cpu_s_median": number_text(median.estimate),
        "cpu_s_95ci": f"[{number_text(median.low)}, {number_text(median.high)}]",
        **versus,
        "reached": f"{share.estimate:.1%} [{share.low:.1%}, {share.high:.1%}]",
        "trials_median": number_text(float(np.median([r.trace.trials_to[i] for r in mine]))),
    }


def regret_row(mine: list[Run], j: int) -> command.Row:
    """One method's replays' test regret, in points, at budget ``j``."""
    regret = bootstrap_mean([100 * (r.best_test - r.trace.returned_test[j]) for r in mine])
    return {
        "target": f"regret at {BUDGETS[j]:g}x grid",
        "method": mine[0].method,
        "replays": len(mine),
        "regret_points": f"{regret.estimate:.2f} [{regret.low:.2f}, {regret.high:.2f}]",
        "trials_median": number_text(float(np.median([r.trace.trials for r in mine]))),
    }


def number_text(value: float) -> str:
    return "inf" if value == math.inf else f"{value:.0f}"


def run(
    seeds: range,
    fraction: float = FRACTION,
    table_path: Path = E.TABLE,
    workers: int = WORKERS,
    methods: tuple[Method, ...] | None = None,
    folder: Path = TABLES,
    kind: str = "replay",
) -> list[command.Row]:
    """Replay ``methods`` (:func:`methods_at` the fraction) from ``seeds`` on the evidence table at
    ``fraction``; writes every replay to ``folder/<kind>-<fraction>-<seeds>.parquet``. A method
    that file already holds for every seed is read back, not replayed again: the methods are
    replayed in resumable parts, and one added later runs alone."""
    methods = methods or methods_at(known(fraction))
    by_fraction = tables_at({fraction, *(m.warm_from for m in methods if m.warm_from is not None)}, table_path)
    tables = by_fraction[fraction]
    out = runs_file(folder, kind, fraction, seeds)
    done = read_runs(out, seeds) if out.exists() else []  # a rerun replays only the methods the file lacks
    for method in methods:  # one method at a time, written as it ends: a kill loses at most one
        if method.name not in {r.method for r in done}:
            sources = by_fraction[method.warm_from] if method.warm_from is not None else None
            done += replays(tables, (method,), seeds, workers, sources)
            write_runs(out, done)
    order = [m.name for m in methods]
    return summarize(
        sorted((r for r in done if r.method in order), key=lambda r: (order.index(r.method), r.seed)),
        {s: first_rung_tau(t) for s, t in tables.items()},
    )


def tables_at(fractions: set[float], table_path: Path = E.TABLE) -> dict[float, dict[int, list[Curve]]]:
    """The evidence table's curves at each of ``fractions``, by training seed; refused unless it
    holds every configuration there."""
    for fraction in fractions:
        known(fraction)
    table = pd.read_parquet(table_path)
    by_fraction = {f: {s: curves(table, f, s) for s in E.SEEDS} for f in fractions}
    short = {
        f: [len(t) for t in tables.values()]
        for f, tables in by_fraction.items()
        if any(len(t) != E.SIZE for t in tables.values())
    }
    if short:
        f, sizes = next(iter(short.items()))
        raise ConfigError(
            f"the evidence table at {f:.1%} has {', '.join(map(str, sizes))} configurations per seed, "
            f"not {E.SIZE}: build it first (python -m research.evidence_table)"
        )
    return by_fraction


def known(fraction: float) -> float:
    """``fraction``, refused unless the evidence table has it."""
    if fraction not in E.FRACTIONS:
        raise ConfigError(
            f"--fraction {fraction} is not a fraction of the evidence table "
            f"({', '.join(str(f) for f in sorted(E.FRACTIONS))})"
        )
    return fraction


def runs_file(folder: Path, kind: str, fraction: float, seeds: range) -> Path:
    """``folder/<kind>-<fraction in thousandths>-seeds-<first>-<last>.parquet``."""
    return folder / f"{kind}-{round(fraction * 1000):04d}-seeds-{seeds.start}-{seeds.stop - 1}.parquet"


# A replay's row in a replay file, as written and read back: its method and figures (a column per
# target, budget or objective).
Recorded: TypeAlias = dict[str, str | float]


def write_rows(path: Path, rows: command.Rows) -> None:
    """A replay file: a row per replay, the file replaced whole or not at all."""
    partial = path.with_name(f".{path.name}.partial")
    pd.DataFrame(rows).to_parquet(partial, index=False)
    partial.replace(path)


def complete_rows(path: Path, seeds: range) -> list[Recorded]:
    """The rows of ``seeds`` in a replay file (:func:`write_rows`), of the methods it has every one of."""
    frame = pd.read_parquet(path)
    frame = frame[frame.seed.isin(seeds)]  # a file may hold more seeds than asked for
    complete = [m for m, group in frame.groupby("method", sort=False) if sorted(group.seed) == list(seeds)]
    return frame[frame.method.isin(complete)].to_dict("records")  # type: ignore[return-value]


def write_runs(path: Path, runs: list[Run]) -> None:
    """Every replay of ``runs``, a row each."""
    write_rows(
        path,
        [
            {
                "method": r.method,
                "seed": r.seed,
                "cost_seed": r.cost_seed,
                "best_test": r.best_test,
                "trials": r.trace.trials,
                **{f"target_p{p}": t for p, t in zip(TARGET_PERCENTILES, r.targets)},
                **{f"cpu_s_p{p}": c for p, c in zip(TARGET_PERCENTILES, r.trace.costs)},
                **{f"trials_p{p}": c for p, c in zip(TARGET_PERCENTILES, r.trace.trials_to)},
                **{f"test_at_{b:g}x": v for b, v in zip(BUDGETS, r.trace.returned_test)},
                "best_cross": r.best_cross,
                **{f"cross_at_{b:g}x": v for b, v in zip(BUDGETS, r.trace.returned_cross)},
            }
            for r in runs
        ],
    )


def read_runs(path: Path, seeds: range) -> list[Run]:
    """The replays of ``seeds`` a file holds (:func:`write_runs`), of the methods it has every one of."""
    return [
        Run(
            str(row["method"]),
            int(row["seed"]),
            int(row["cost_seed"]),
            tuple(float(row[f"target_p{p}"]) for p in TARGET_PERCENTILES),
            float(row["best_test"]),
            Trace(
                tuple(float(row[f"cpu_s_p{p}"]) for p in TARGET_PERCENTILES),
                tuple(float(row[f"trials_p{p}"]) for p in TARGET_PERCENTILES),
                tuple(float(row[f"test_at_{b:g}x"]) for b in BUDGETS),
                int(row["trials"]),
                tuple(float(row[f"cross_at_{b:g}x"]) for b in BUDGETS) if f"cross_at_{BUDGETS[0]:g}x" in row else (),
            ),
            float(row.get("best_cross", math.nan)),
        )  # files written before cross-seed scoring lack it
        for row in complete_rows(path, seeds)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = command.parser("replay", __doc__, "seeds")
    parser.add_argument(
        "--fraction",
        type=float,
        default=FRACTION,
        help="the evidence table's latent fraction to replay on (0.5, 0.25 or 0.125; default 0.25)",
    )
    args = parser.parse_args(argv)
    command.show(run(command.seeds(args.seeds), args.fraction), args.out)


if __name__ == "__main__":
    command.main(main)
