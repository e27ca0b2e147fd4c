"""``seqae bench replay``: search methods replayed on the evidence table, with statistics.

The evidence table (``benchmarks/evidence_table.py``) holds every epoch of 96 configurations at
three latent fractions, trained from two seeds. A method is replayed against one seed's table:
the service's own Optuna sampler (``sweeps.search.sampler``, the quickstart's TPE settings)
proposes over the table's grid, each proposal trains the nearest configuration of the table, the
service's own ASHA (``sweeps.runner.ResumableASHA``, the quickstart's grace 1 and factor 2) stops,
and :data:`WORKERS` asynchronous one-CPU workers take the measured epochs' process CPU-seconds. A
proposal reads only what the sweep would have known when it was made.

**Cross-fitting.** The targets (:data:`TARGET_PERCENTILES`, registered before the table was built)
are percentiles of the configurations' best validation accuracy on one seed's table; the cost of
reaching one is read from the other seed's table, the direction alternating with the replay seed,
so the noise of a table never sets its own target (:func:`targets_for`).

**What a replay records** (:class:`Trace`): the CPU-seconds and trials at which each target is
first reached (an epoch ends with validation accuracy at or above it; the other workers' epochs in
progress count for the time they ran), and the test accuracy of the configuration it would return
(the best validation epoch so far, its kept checkpoint's test score) after spending
:data:`BUDGETS` of the grid's cost, the grid's cost being every configuration trained on the cost
table. A replay runs until the last budget is spent.

**Statistics** (:mod:`benchmarks.intervals`): per method and target, the median cost with its
order-statistic 95% interval (unreached replays count as infinitely costly), its ratio to the
grid's median with a bootstrap interval, the share reached with Wilson's interval, the median
trials; per method and budget, the simple regret (the cost table's best test accuracy minus the
returned one, in points) with a bootstrap interval; Kendall's tau of the first rung for the ASHA
methods.
"""

from __future__ import annotations

import heapq
import itertools
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import optuna
import pandas as pd
from scipy.stats import kendalltau

from benchmarks import evidence_table as E
from benchmarks.intervals import bootstrap_mean, median_interval, ratio_interval, wilson
from seqae_core import metrics as M
from seqae_errors import ConfigError
from sweeps import spec as spec_lib
from sweeps.runner import ResumableASHA
from sweeps.search import TrialSpec, sampler

WORKERS = 2
# The evidence table's targets, registered before it was built: a configuration's best validation
# accuracy at these percentiles of one training seed's table; the cost of reaching it is read from
# the other seed's table, and both ways round (cross-fitting), so no table's noise sets its own target.
TARGET_PERCENTILES = (75, 90, 97)
BUDGETS = (0.25, 0.5, 1.0)  # shares of the grid's cost at which the returned configuration is scored
FRACTION = 0.25  # the fraction replayed by default
TABLES = E.TABLES


@dataclass(frozen=True)
class Curve:
    """One configuration's training on one seed's table, epoch by epoch."""

    config_id: int
    params: dict[str, Any]
    val: tuple[float, ...]  # validation token accuracy
    test: tuple[float, ...]  # test token accuracy of the checkpoint kept by that epoch
    cpu: tuple[float, ...]  # process CPU-seconds


@dataclass(frozen=True)
class Method:
    name: str
    sampler: str  # grid (every configuration, in an order the seed shuffles), random or tpe
    asha: bool


METHODS = (Method("grid", "grid", False), Method("random", "random", False), Method("tpe", "tpe", False),
           Method("asha+random", "random", True), Method("asha+tpe", "tpe", True))
# The quickstart's TPE and ASHA (sweeps/studies/quickstart.yaml): what users run.
TPE = {"n_startup_trials": 2, "multivariate": True, "group": True, "constant_liar": True}
GRACE_PERIOD, REDUCTION_FACTOR = 1, 2


@dataclass(frozen=True)
class Trace:
    """One replay."""

    costs: tuple[float, ...]  # CPU-seconds to each target; inf: not reached within the last budget
    trials_to: tuple[float, ...]  # trials started by then; inf likewise
    returned_test: tuple[float, ...]  # the returned configuration's test accuracy at each budget
    trials: int  # trials started in all


def curves(table: pd.DataFrame, fraction: float, seed: int) -> list[Curve]:
    """The configurations of ``table`` at ``fraction`` trained from ``seed``, by configuration."""
    rows = table[(table.latent_fraction == fraction) & (table.seed == seed)].sort_values(["config_id", "epoch"])
    return [Curve(int(config_id), E.CONFIGURATIONS[int(config_id)], tuple(group.val_token_accuracy),
                  tuple(group.test_token_accuracy), tuple(group.cpu_seconds))
            for config_id, group in rows.groupby("config_id", sort=True)]


def targets_for(target_table: list[Curve]) -> tuple[float, ...]:
    """The registered targets, read from ``target_table`` only."""
    return tuple(float(np.percentile([max(c.val) for c in target_table], p)) for p in TARGET_PERCENTILES)


def _spec(method: Method, seed: int) -> spec_lib.SweepSpec:
    """A sweep over the table's grid with ``method``'s sampler, as a user would write it."""
    search: dict[str, dict[str, Any]] = {k: {"type": "categorical", "choices": list(v)}
                                         for k, v in E.GRID.items() if k != "model.heads"}
    search["model.heads"] = {"type": "categorical", "choices": list(E.GRID["model.heads"]),
                             "when": {"model.block": "transformer"}}
    doc = {"search": search, "trials": {"total": 10_000},
           "sampler": {"type": method.sampler, "seed": seed, **(TPE if method.sampler == "tpe" else {})}}
    return spec_lib.parse(doc, f"replay of {method.name}")


class Proposals:
    """The service's sampler over the table's grid; each proposal trains the nearest configuration
    of the table (the table is a space-filling subset of the grid)."""

    def __init__(self, table: list[Curve], method: Method, seed: int) -> None:
        self.spec = _spec(method, seed)
        self.study = optuna.create_study(direction="maximize", sampler=sampler(self.spec, 10_000))
        self.table = table
        self.coords = E._coordinates([c.params for c in table])

    def ask(self) -> tuple[Curve, optuna.Trial]:
        trial = self.study.ask()
        params: dict[str, Any] = {}
        for key in self.spec.sampling_order():
            if self.spec.search[key].active(params):
                params[key] = trial.suggest_categorical(key, self.spec.search[key].choices)  # type: ignore[arg-type]
        point = E._coordinates([{**params, "model.heads": params.get("model.heads", 1)}])[0]
        nearest = int(np.argmin(np.linalg.norm(self.coords - point, axis=1)))
        return self.table[nearest], trial


def replay(table: list[Curve], method: Method, seed: int, targets: tuple[float, ...], *,
           workers: int = WORKERS, budgets: tuple[float, ...] = BUDGETS) -> Trace:
    """Run ``method`` against ``table`` until ``budgets[-1]`` x the grid's cost is spent (a grid:
    until every configuration is trained)."""
    grid_cost = sum(sum(c.cpu) for c in table)
    horizon = budgets[-1] * grid_cost
    epochs = len(table[0].val)
    order = list(table)
    np.random.default_rng(seed).shuffle(order)  # type: ignore[arg-type]
    proposals = None if method.sampler == "grid" else Proposals(table, method, seed)
    asha = (ResumableASHA({}, 1.0, time_attr=M.EPOCH, metric=M.VAL_TOKEN_ACCURACY, mode="max", max_t=epochs,
                          grace_period=GRACE_PERIOD, reduction_factor=REDUCTION_FACTOR) if method.asha else None)
    events: list[tuple[float, int, int]] = []  # (ends at, tie-break, trial number): a trial's epoch ends
    running: dict[int, tuple[Curve, Any, SimpleNamespace, int, float]] = {}  # curve, trial, view, epoch, since
    counter = itertools.count()
    started, closed = 0, 0.0  # trials started; CPU-seconds of the epochs ended
    costs, trials_to = [math.inf] * len(targets), [math.inf] * len(targets)
    returned: list[float] = []
    best_val, best_test = -math.inf, math.nan

    def spent(now: float) -> float:
        return closed + sum(now - since for *_, since in running.values())

    def start(now: float) -> bool:
        nonlocal started
        if method.sampler == "grid":
            if started >= len(order):
                return False
            curve, handle = order[started], None
        else:
            assert proposals is not None
            curve, handle = proposals.ask()
        number = started
        started += 1
        view = SimpleNamespace(trial_id=str(number), config={"trial": TrialSpec(number, {}, None)})
        if asha is not None:
            asha.on_trial_add(None, view)
        running[number] = (curve, handle, view, 1, now)
        heapq.heappush(events, (now + curve.cpu[0], next(counter), number))
        return True

    for _ in range(workers):
        start(0.0)
    while events and len(returned) < len(budgets):
        now, _, number = heapq.heappop(events)
        while len(returned) < len(budgets) and spent(now) >= budgets[len(returned)] * grid_cost:
            returned.append(best_test)  # what had ended before the budget ran out
        if len(returned) == len(budgets):
            break
        curve, handle, view, epoch, _ = running[number]
        closed += curve.cpu[epoch - 1]
        value = curve.val[epoch - 1]
        if value > best_val:
            best_val, best_test = value, curve.test[epoch - 1]
        del running[number]
        for i, target in enumerate(targets):
            if value >= target and costs[i] == math.inf:
                costs[i], trials_to[i] = spent(now), started
        if handle is not None:
            handle.report(value, epoch)
        stop = (asha is not None and asha.on_trial_result(None, view, {M.EPOCH: epoch, M.VAL_TOKEN_ACCURACY: value})
                == ResumableASHA.STOP)
        if epoch < epochs and not stop:
            running[number] = (curve, handle, view, epoch + 1, now)
            heapq.heappush(events, (now + curve.cpu[epoch], next(counter), number))
            continue
        if proposals is not None:
            if epoch < epochs:
                proposals.study.tell(handle, state=optuna.trial.TrialState.PRUNED)
            else:  # the value a sweep records: the best epoch's, which early stopping keeps
                proposals.study.tell(handle, max(curve.val))
        if spent(now) < horizon:
            start(now)
    returned += [best_test] * (len(budgets) - len(returned))  # a grid ends at its cost exactly
    return Trace(tuple(costs), tuple(trials_to), tuple(returned), started)


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


def _one(tables: dict[int, list[Curve]], method: Method, seed: int) -> Run:
    seeds = sorted(tables)
    cost_seed, target_seed = seeds[seed % 2], seeds[1 - seed % 2]
    table = tables[cost_seed]
    targets = targets_for(tables[target_seed])
    return Run(method.name, seed, cost_seed, targets, max(c.test[-1] for c in table),
               replay(table, method, seed, targets))


def replays(tables: dict[int, list[Curve]], methods: tuple[Method, ...], seeds: range,
            workers: int = 1) -> list[Run]:
    """Every method replayed from every seed (in a pool of ``workers`` processes)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    jobs = [(tables, m, s) for m in methods for s in seeds]
    if workers <= 1:
        return [_one(*job) for job in jobs]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=optuna.logging.set_verbosity, initargs=(optuna.logging.WARNING,)) as pool:
        return list(pool.map(_one, *zip(*jobs), chunksize=max(1, len(jobs) // (8 * workers))))


def summarize(runs: list[Run], taus: dict[int, float]) -> list[dict[str, Any]]:
    """A row per method and target (cost to it), then per method and budget (regret)."""
    by_method = {m: [r for r in runs if r.method == m] for m in dict.fromkeys(r.method for r in runs)}
    grid = by_method.get("grid")
    rows: list[dict[str, Any]] = []
    for i, percentile in enumerate(TARGET_PERCENTILES):
        for method, mine in by_method.items():
            costs = [r.trace.costs[i] for r in mine]
            reached = sum(c < math.inf for c in costs)
            median = median_interval(costs)
            share = wilson(reached, len(costs))
            rows.append({
                "target": f"p{percentile}", "method": method, "replays": len(mine),
                "target_value": f"{np.mean([r.targets[i] for r in mine]):.4f}",
                "cpu_s_median": _number(median.estimate), "cpu_s_95ci": f"[{_number(median.low)}, {_number(median.high)}]",
                "vs_grid": (ratio_interval(costs, [r.trace.costs[i] for r in grid]).ratio() if grid else ""),
                "reached": f"{share.estimate:.1%} [{share.low:.1%}, {share.high:.1%}]",
                "trials_median": _number(float(np.median([r.trace.trials_to[i] for r in mine]))),
                **({"first_rung_tau": f"{np.mean(list(taus.values())):.3f}"} if method.startswith("asha") else {}),
            })
    for j, budget in enumerate(BUDGETS):
        for method, mine in by_method.items():
            regret = bootstrap_mean([100 * (r.best_test - r.trace.returned_test[j]) for r in mine])
            rows.append({"target": f"regret at {budget:g}x grid", "method": method, "replays": len(mine),
                         "regret_points": f"{regret.estimate:.2f} [{regret.low:.2f}, {regret.high:.2f}]",
                         "trials_median": _number(float(np.median([r.trace.trials for r in mine])))})
    return rows


def _number(value: float) -> str:
    return "inf" if value == math.inf else f"{value:.0f}"


def run(seeds: range, fraction: float = FRACTION, table_path: Path = E.TABLE, workers: int = WORKERS,
        methods: tuple[Method, ...] = METHODS) -> list[dict[str, Any]]:
    """Replay ``methods`` from ``seeds`` on the evidence table at ``fraction``; writes every replay
    to ``benchmarks/tables/replay-<fraction>-<seeds>.parquet``."""
    if fraction not in E.FRACTIONS:
        raise ConfigError(f"--fraction {fraction} is not a fraction of the evidence table "
                          f"({', '.join(str(f) for f in sorted(E.FRACTIONS))})")
    table = pd.read_parquet(table_path)
    tables = {s: curves(table, fraction, s) for s in E.SEEDS}
    if any(len(t) != E.SIZE for t in tables.values()):
        raise ConfigError(f"the evidence table at {fraction:.1%} has {', '.join(str(len(t)) for t in tables.values())} "
                         f"configurations per seed, not {E.SIZE}: build it first (seqae bench table)")
    done = replays(tables, methods, seeds, workers)
    out = TABLES / f"replay-{round(fraction * 1000):04d}-seeds-{seeds.start}-{seeds.stop - 1}.parquet"
    pd.DataFrame([{"method": r.method, "seed": r.seed, "cost_seed": r.cost_seed, "best_test": r.best_test,
                   "trials": r.trace.trials,
                   **{f"target_p{p}": t for p, t in zip(TARGET_PERCENTILES, r.targets)},
                   **{f"cpu_s_p{p}": c for p, c in zip(TARGET_PERCENTILES, r.trace.costs)},
                   **{f"trials_p{p}": c for p, c in zip(TARGET_PERCENTILES, r.trace.trials_to)},
                   **{f"test_at_{b:g}x": v for b, v in zip(BUDGETS, r.trace.returned_test)}} for r in done]
                 ).to_parquet(out, index=False)
    return summarize(done, {s: first_rung_tau(t) for s, t in tables.items()})
