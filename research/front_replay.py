"""``python -m research.front_replay``: the compression frontier searched with several objectives, replayed on
the evidence table against the grid and random search.

**The space**: the evidence table's 96 configurations at its three latent fractions (16 -> 8, 4 and
2 tokens), the fraction a searched key (``model.latent_fraction``) beside the table's. A method
proposes with the service's own sampler for two objectives,
validation accuracy (max) and the latent share (min; on this table the latent fraction, each
latent token as wide as d_model); a proposal trains the table's nearest configuration at its
fraction, to the end or until the service's multi-objective ASHA (driven through
:func:`sweeps.running.simulation.simulate`,
the quickstart's grace 1 and factor 2) stops it, on :data:`WORKERS` asynchronous one-CPU workers
that take the measured epochs' process CPU-seconds. The grid trains all 288, in
an order the seed shuffles. Each replay's costs come from one training seed's table, alternating
with the replay seed.

**What is scored** (registered before measuring): after each trial ends, the front a sweep
returns (its complete trials, not the ones ASHA stopped, that no other beats on validation
accuracy and latent share) is
scored by the hypervolume of its *test* accuracies (each trial's kept checkpoint) against
log2 of the latent share: each halving of the latent counts alike, the reference point at the
whole input (log2 1 = 0) and at the lowest test accuracy of any of the table's 288 trainings.
The grid's front is the same over all 288; the targets are :data:`TARGETS` of its hypervolume, and
the cost of reaching one is the CPU-seconds spent when a returned front first scores that much
(the epochs of trials still running count for the time they ran), in units of the grid's cost
(all 288 trainings). A replay runs until :data:`BUDGETS`'s last share of the grid's cost is spent.

**Statistics** (:mod:`research.intervals`): per method and target, the median cost with its
order-statistic 95% interval (an unreached target counts as infinitely costly), its ratio to the
shuffled grid's and random search's with bootstrap intervals, the share reached with Wilson's
interval; per method and budget, the mean
share of the grid front's test hypervolume with its t interval (hundreds of replays).
"""

from __future__ import annotations

import heapq
import itertools
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
import pandas as pd

from research import TABLES, command
from research import evidence_table as E
from research.intervals import median_interval, ratio_interval, t_interval, wilson
from research.replay import GRACE_PERIOD, REDUCTION_FACTOR, TPE, Curve, complete_rows, curves, nearest, write_rows
from seqae_core import metrics as M
from seqae_core.borders import Document
from seqae_core.pareto import hypervolume, ranks
from seqae_errors import ConfigError
from sweeps.running.simulation import Simulation, simulate

WORKERS = 2
# Shares of the grid front's test hypervolume: the frontier issue's 95%, to be reached for at most
# TARGET_COST x the grid's CPU-seconds, and a stricter 99% registered beside it.
TARGETS = (0.95, 0.99)
TARGET_COST = 0.4
BUDGETS = (0.1, 0.2, 0.3, 0.4, 0.6, 1.0)  # shares of the grid's cost at which the returned front is scored
MODES = ("max", "min")  # validation (or test) accuracy, log2 latent share
TOTAL = round(TARGET_COST * E.SIZE * len(E.FRACTIONS))  # trials.total a user would set for that budget: 115


@dataclass(frozen=True)
class Method:
    name: str
    sampler: str  # grid (all 288, shuffled), random, nsga2 or tpe: the service's, for two objectives
    scheduler: str = "none"  # or asha: the service's, ranking each rung by non-dominated sorting


# Registered before measuring: the grid, random search, and the service's two multi-objective
# samplers as a user gets them (NSGA-II's population from trials.total; TPE with frontier.yaml's
# settings), each also with multi-objective ASHA.
METHODS = (
    Method("grid", "grid"),
    Method("random", "random"),
    Method("nsga2", "nsga2"),
    Method("tpe", "tpe"),
    Method("asha+random", "random", "asha"),
    Method("asha+nsga2", "nsga2", "asha"),
    Method("asha+tpe", "tpe", "asha"),
)
OBJECTIVES = ({"metric": M.VAL_TOKEN_ACCURACY, "mode": "max"}, {"metric": M.LATENT_SHARE, "mode": "min"})


@dataclass(frozen=True)
class Point:
    """One training of the space: a configuration at a latent fraction."""

    fraction: float
    curve: Curve

    @property
    def share(self) -> float:
        return math.log2(self.fraction)


@dataclass(frozen=True)
class Trace:
    """One replay."""

    costs: tuple[
        float, ...
    ]  # per target, in units of the grid's cost when first reached; inf: not within the last budget
    trials_to: tuple[float, ...]  # trials started by then; inf likewise
    shares: tuple[float, ...]  # the returned front's share of the grid front's test hypervolume at each budget
    trials: int  # trials started in all


def front_hypervolume(points: list[Point], reference: float) -> float:
    """The test hypervolume of the front that ``points`` return, selected on validation."""
    if not points:
        return 0.0
    on_front = ranks([[max(p.curve.val), p.share] for p in points], MODES) == 1
    return hypervolume(
        [[p.curve.test[-1], p.share] for p, top in zip(points, on_front) if top], MODES, [reference, 0.0]
    )


def simulation(method: Method, seed: int) -> Simulation:
    """A two-objective sweep over the table's grid and its fractions, as a user would write it."""
    search: dict[str, Document] = {
        k: {"type": "categorical", "choices": list(v)} for k, v in E.GRID.items() if k != "model.heads"
    }
    search["model.heads"] = {
        "type": "categorical",
        "choices": list(E.GRID["model.heads"]),
        "when": {"model.block": "transformer"},
    }
    search["model.latent_fraction"] = {"type": "categorical", "choices": sorted(E.FRACTIONS)}
    tpe = {**TPE, "n_startup_trials": 2} if method.sampler == "tpe" else {}
    doc = {
        "config": {"train": {"epochs": E.EPOCHS}},
        "search": search,
        "trials": {"total": TOTAL},
        "objective": list(OBJECTIVES),
        "sampler": {"type": method.sampler, "seed": seed, **tpe},
        "scheduler": {"type": method.scheduler, "grace_period": GRACE_PERIOD, "reduction_factor": REDUCTION_FACTOR},
    }
    return simulate(doc, f"front replay of {method.name}")


class Proposals:
    """The sweep's searcher over the space (``simulation``); each proposal trains the table's nearest
    configuration at the proposed fraction."""

    def __init__(self, tables: dict[float, list[Curve]], simulation: Simulation) -> None:
        self.simulation = simulation
        self.study = simulation.study
        self.tables = tables
        self.coords = E._coordinates([c.params for c in next(iter(tables.values()))])

    def ask(self) -> tuple[Point, optuna.Trial]:
        (proposal,) = self.simulation.ask()
        params = dict(proposal.params)
        fraction = params.pop("model.latent_fraction")
        return Point(fraction, self.tables[fraction][nearest(self.coords, params)]), proposal.trial


def replay(tables: dict[float, list[Curve]], method: Method, seed: int) -> Trace:
    """Run ``method`` on one seed's ``tables`` (by fraction) until the last budget is spent."""
    space = [Point(f, c) for f, table in sorted(tables.items()) for c in table]
    grid_cost = sum(sum(p.curve.cpu) for p in space)
    epochs = len(space[0].curve.val)
    reference = min(p.curve.test[-1] for p in space)
    whole = front_hypervolume(space, reference)
    order = list(space)
    np.random.default_rng(seed).shuffle(order)  # type: ignore[arg-type]
    sweep = None if method.sampler == "grid" else simulation(method, seed)
    proposals = None if sweep is None else Proposals(tables, sweep)
    events: list[tuple[float, int, int]] = []  # (an epoch ends at, tie-break, trial number)
    running: dict[int, tuple[Point, optuna.Trial | None, int, float]] = {}  # point, Optuna trial, epoch, since
    ended: list[Point] = []
    counter = itertools.count()
    started, closed = 0, 0.0
    costs, trials_to = [math.inf] * len(TARGETS), [math.inf] * len(TARGETS)
    shares: list[float] = []
    score = 0.0

    def spent(now: float) -> float:
        return closed + sum(now - since for *_, since in running.values())

    def start(now: float) -> None:
        nonlocal started
        if proposals is None:
            if started >= len(order):
                return
            point, handle = order[started], None
        else:
            point, handle = proposals.ask()
        if sweep is not None:
            sweep.start(started)
        running[started] = (point, handle, 1, now)
        heapq.heappush(events, (now + point.curve.cpu[0], next(counter), started))
        started += 1

    for _ in range(WORKERS):
        start(0.0)
    while events and len(shares) < len(BUDGETS):
        now, _, number = heapq.heappop(events)
        while len(shares) < len(BUDGETS) and spent(now) >= BUDGETS[len(shares)] * grid_cost:
            shares.append(score / whole)  # what had ended before the budget ran out
        if len(shares) == len(BUDGETS):
            break
        point, handle, epoch, _ = running.pop(number)
        closed += point.curve.cpu[epoch - 1]
        record = {M.EPOCH: epoch, M.VAL_TOKEN_ACCURACY: point.curve.val[epoch - 1], M.LATENT_SHARE: point.fraction}
        if epoch < epochs and (sweep is None or not sweep.result(number, record)):
            running[number] = (point, handle, epoch + 1, now)
            heapq.heappush(events, (now + point.curve.cpu[epoch], next(counter), number))
            continue
        if epoch < epochs:  # stopped by ASHA: pruned, off the front a sweep returns
            assert proposals is not None and handle is not None
            proposals.study.tell(handle, state=optuna.trial.TrialState.PRUNED)
            start(now)
            continue
        ended.append(point)
        # the values a sweep records: the kept (best validation) epoch's
        if proposals is not None and handle is not None:
            proposals.study.tell(handle, [max(point.curve.val), point.fraction])
        score = front_hypervolume(ended, reference)
        for i, target in enumerate(TARGETS):
            if score >= target * whole and costs[i] == math.inf:
                costs[i], trials_to[i] = spent(now) / grid_cost, started
        start(now)
    shares += [score / whole] * (len(BUDGETS) - len(shares))  # a grid ends at its cost exactly
    return Trace(tuple(costs), tuple(trials_to), tuple(shares), started)


@dataclass(frozen=True)
class Run:
    method: str
    seed: int
    cost_seed: int  # the training seed whose table gave the costs and the scores
    trace: Trace


def _one(tables: dict[int, dict[float, list[Curve]]], method: Method, seed: int) -> Run:
    cost_seed = sorted(tables)[seed % 2]
    return Run(method.name, seed, cost_seed, replay(tables[cost_seed], method, seed))


def replays(tables: dict[int, dict[float, list[Curve]]], method: Method, seeds: range, workers: int) -> list[Run]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    jobs = [(tables, method, s) for s in seeds]
    if workers <= 1:
        return [_one(*job) for job in jobs]
    with ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=optuna.logging.set_verbosity,
        initargs=(optuna.logging.WARNING,),
    ) as pool:
        return list(pool.map(_one, *zip(*jobs), chunksize=max(1, len(jobs) // (8 * workers))))


def summarize(runs: list[Run]) -> list[command.Row]:
    """A row per target and method: its cost to the target, against the target cost, the shuffled
    grid and random search; then the share of the grid front's hypervolume at each budget."""
    by_method = {m: [r for r in runs if r.method == m] for m in dict.fromkeys(r.method for r in runs)}
    rows: list[command.Row] = []
    for i, target in enumerate(TARGETS):
        versus = {m: [r.trace.costs[i] for r in by_method.get(m, [])] for m in ("grid", "random")}
        for method, mine in by_method.items():
            costs = [r.trace.costs[i] for r in mine]
            median = median_interval(costs)
            reached = wilson(sum(c < math.inf for c in costs), len(costs))
            verdict = (
                "met"
                if median.high <= TARGET_COST
                else "met at the estimate only"
                if median.estimate <= TARGET_COST
                else "missed"
            )
            rows.append(
                {
                    "target": f"{target:.0%} of the grid's hypervolume",
                    "method": method,
                    "replays": len(mine),
                    "cost_vs_grid": f"{median.estimate:.3f} [{median.low:.3f}, {median.high:.3f}]",
                    f"at_most_{TARGET_COST:g}x": verdict,
                    **{
                        f"vs_{m}": ratio_interval(costs, other).ratio() if other and m != method else ""
                        for m, other in versus.items()
                    },
                    "reached": f"{reached.estimate:.1%} [{reached.low:.1%}, {reached.high:.1%}]",
                    "trials_median": f"{np.median([r.trace.trials_to[i] for r in mine]):.0f}",
                }
            )
    for j, budget in enumerate(BUDGETS):
        row: command.Row = {"target": f"hypervolume share at {budget:g}x grid"}
        for method, mine in by_method.items():
            share = t_interval([r.trace.shares[j] for r in mine])
            row[method] = f"{share.estimate:.3f} [{share.low:.3f}, {share.high:.3f}]"
        rows.append(row)
    return rows


def run(
    seeds: range,
    table_path: Path = E.TABLE,
    workers: int = WORKERS,
    methods: tuple[Method, ...] = METHODS,
    folder: Path = TABLES,
) -> list[command.Row]:
    """Replay ``methods`` from ``seeds``; writes every replay to ``folder/front-replay-<seeds>.parquet``,
    one method at a time; a method the file already holds for every seed is read back."""
    table = pd.read_parquet(table_path)
    tables = {s: {f: curves(table, f, s) for f in E.FRACTIONS} for s in E.SEEDS}
    sizes = sorted({len(t) for by_fraction in tables.values() for t in by_fraction.values()})
    if sizes != [E.SIZE]:
        raise ConfigError(
            f"the evidence table has {', '.join(map(str, sizes))} configurations per fraction and "
            f"seed, not {E.SIZE}: build it first (python -m research.evidence_table)"
        )
    out = folder / f"front-replay-seeds-{seeds.start}-{seeds.stop - 1}.parquet"
    done = _read_runs(out, seeds) if out.exists() else []
    for method in methods:
        if method.name not in {r.method for r in done}:
            done += replays(tables, method, seeds, workers)
            _write_runs(out, done)
    order = [m.name for m in methods]
    return summarize(sorted((r for r in done if r.method in order), key=lambda r: (order.index(r.method), r.seed)))


def _write_runs(path: Path, runs: list[Run]) -> None:
    write_rows(
        path,
        [
            {
                "method": r.method,
                "seed": r.seed,
                "cost_seed": r.cost_seed,
                "trials": r.trace.trials,
                **{f"cost_vs_grid_{t:g}": c for t, c in zip(TARGETS, r.trace.costs)},
                **{f"trials_to_{t:g}": n for t, n in zip(TARGETS, r.trace.trials_to)},
                **{f"hv_share_at_{b:g}x": v for b, v in zip(BUDGETS, r.trace.shares)},
            }
            for r in runs
        ],
    )


def _read_runs(path: Path, seeds: range) -> list[Run]:
    return [
        Run(
            str(row["method"]),
            int(row["seed"]),
            int(row["cost_seed"]),
            Trace(
                tuple(float(row[f"cost_vs_grid_{t:g}"]) for t in TARGETS),
                tuple(float(row[f"trials_to_{t:g}"]) for t in TARGETS),
                tuple(float(row[f"hv_share_at_{b:g}x"]) for b in BUDGETS),
                int(row["trials"]),
            ),
        )
        for row in complete_rows(path, seeds)
    ]


def main(argv: list[str] | None = None) -> None:
    args = command.parser("front_replay", __doc__, "seeds").parse_args(argv)
    command.show(run(command.seeds(args.seeds)), args.out)


if __name__ == "__main__":
    command.main(main)
