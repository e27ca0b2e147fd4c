"""``python -m research.subepoch_rungs``: ASHA whose first rung comes before an epoch's end, replayed on
the evidence table validated at each quarter of an epoch (``evidence_table.QUARTERS``).

**The protocol, registered before any replay ran.** Every method is replayed as
:mod:`research.replay` replays it (the service's sampler and ``ResumableASHA``, two one-CPU
workers, cross-fitted targets, the replay seeds), on curves read from the quarter table at the
validations that method's sweep would run:

- a method validates every :attr:`Rungs.every` epochs (``train.validate_every``: 1, 0.5 or 0.25)
  and its ASHA's grace period is that interval, with reduction factor 2: rungs at 0.25, 0.5, 1,
  2, 4 and 8 epochs for a quarter, 1, 2, 4 and 8 for a whole epoch;
- it is charged what validating that often costs: each quarter's training CPU-seconds
  (``cpu_seconds - validation_cpu_seconds``) and the validation's CPU-seconds only at the quarters
  it validates at;
- the grid and the targets are read once an epoch, the service's default: the targets are the
  registered percentiles of the configurations' best epoch-end validation accuracy on the other
  seed's table, and the grid's cost (the ratio's denominator, and the budgets of the regret) is
  every configuration trained and validated once an epoch;
- a returned configuration's test accuracy is the quarter table's kept checkpoint's at the
  validation it is returned at (a method that validates less often would keep a checkpoint at
  one of its own validations: this favours finer validation by at most the differences between
  a configuration's nearby checkpoints).

**Target** (:data:`TARGET`, issue 66): ASHA with quarter-epoch rungs reaches the p90 target for at
most 0.5x the grid's median CPU-seconds, the ratio's 95% interval below 0.6x, on both seed sets.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
from scipy.stats import kendalltau

from research import TABLES, command
from research import evidence_table as E
from research import replay as R
from research.intervals import ratio_interval
from seqae_errors import ConfigError

QUARTER = 0.25  # the table's validation interval, in epochs
TARGET = {"percentile": 90, "ratio": 0.5, "interval_high": 0.6}


@dataclass(frozen=True)
class Rungs:
    """A replayed method and how often its sweep validates, in epochs (its ASHA's grace period)."""

    method: R.Method
    every: float

    @property
    def name(self) -> str:
        if self.method.scheduler == "none":
            return self.method.name
        return f"{self.method.name}, rungs from {self.every:g} epoch"


# Registered before any replay ran: the grid and random search as the baselines, and ASHA with
# random search (the studies' default) with its first rung at 1, 0.5 and 0.25 epochs. (ASHA with
# TPE would take about three times random search's CPU per replay, more than the session had.)
METHODS = (
    Rungs(R.Method("grid", "grid"), 1.0),
    Rungs(R.Method("random", "random"), 1.0),
    Rungs(R.Method("asha+random", "random", "asha"), 1.0),
    Rungs(R.Method("asha+random", "random", "asha"), 0.5),
    Rungs(R.Method("asha+random", "random", "asha"), 0.25),
)


def curves(table: pd.DataFrame, seed: int, every: float) -> list[R.Curve]:
    """The quarter table's trainings from ``seed`` as a sweep validating every ``every`` epochs
    sees them: one entry per validation, its CPU-seconds the quarters' training since the last and
    one validation."""
    step = round(every / QUARTER)
    rows = table[table.seed == seed].sort_values(["config_id", "epoch"])
    out = []
    for config_id, group in rows.groupby("config_id", sort=True):
        train = (group.cpu_seconds - group.validation_cpu_seconds).to_numpy()
        scoring = group.validation_cpu_seconds.to_numpy()
        ends = np.arange(step - 1, len(group), step)  # the quarters it validates at
        cost = np.add.reduceat(train, ends - step + 1) + scoring[ends]
        out.append(
            R.Curve(
                int(config_id),
                E.CONFIGURATIONS[int(config_id)],
                tuple(group.val_token_accuracy.to_numpy()[ends]),
                tuple(group.test_token_accuracy.to_numpy()[ends]),
                tuple(float(c) for c in cost),
            )
        )
    return out


@dataclass(frozen=True)
class Views:
    """One seed's table as each validation interval sees it."""

    by_every: dict[float, list[R.Curve]]

    @property
    def epochs(self) -> list[R.Curve]:
        return self.by_every[1.0]


def _one(views: dict[int, Views], rungs: Rungs, seed: int) -> R.Run:
    seeds = sorted(views)
    cost_seed, target_seed = seeds[seed % 2], seeds[1 - seed % 2]
    targets = R.targets_for(views[target_seed].epochs)
    grid_cost = sum(sum(c.cpu) for c in views[cost_seed].epochs)
    trace = R.replay(views[cost_seed].by_every[rungs.every], rungs.method, seed, targets, grid_cost=grid_cost)
    return R.Run(rungs.name, seed, cost_seed, targets, max(c.test[-1] for c in views[cost_seed].epochs), trace)


def replays(views: dict[int, Views], methods: tuple[Rungs, ...], seeds: range, workers: int = R.WORKERS) -> list[R.Run]:
    """Every method replayed from every seed, in a pool of ``workers`` processes."""
    jobs = [(views, m, s) for m in methods for s in seeds]
    if workers <= 1:
        return [_one(*job) for job in jobs]
    with ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=optuna.logging.set_verbosity,
        initargs=(optuna.logging.WARNING,),
    ) as pool:
        return list(pool.map(_one, *zip(*jobs), chunksize=max(1, len(jobs) // (8 * workers))))


def first_rung_tau(views: Views, every: float) -> float:
    """Kendall's tau between the configurations' validation accuracy at the first rung (the first
    validation at ``every``) and their best once-an-epoch validation accuracy."""
    return float(kendalltau([c.val[0] for c in views.by_every[every]], [max(c.val) for c in views.epochs])[0])


def summarize(runs: list[R.Run], methods: tuple[Rungs, ...], taus: dict[float, float]) -> list[command.Row]:
    """Per method and target: the median cost with its interval and its ratio to the grid's, the
    share reached; per method and budget: the simple regret in points. The quarter-rung rows of
    the p90 target say whether :data:`TARGET` is met."""
    grid = [r for r in runs if r.method == "grid"]
    by_method = {rungs.name: [r for r in runs if r.method == rungs.name] for rungs in methods}
    rows: list[command.Row] = []
    for i, percentile in enumerate(R.TARGET_PERCENTILES):
        for rungs in methods:
            mine = by_method[rungs.name]
            ratio = ratio_interval([r.trace.costs[i] for r in mine], [r.trace.costs[i] for r in grid])
            row = R.cost_row(mine, i, {"vs_grid": ratio.ratio()})
            if rungs.method.scheduler != "none":
                row["first_rung_tau"] = f"{taus[rungs.every]:.3f}"
            if percentile == TARGET["percentile"] and rungs.every == QUARTER and rungs.method.scheduler == "asha":
                met = ratio.estimate <= TARGET["ratio"] and ratio.high < TARGET["interval_high"]
                row["target_0.5x"] = "met" if met else "missed"
            rows.append(row)
    rows += [R.regret_row(by_method[rungs.name], j) for j in range(len(R.BUDGETS)) for rungs in methods]
    return rows


def run(
    seeds: range,
    table_path: Path = E.QUARTERS.path,
    workers: int = R.WORKERS,
    methods: tuple[Rungs, ...] = METHODS,
    folder: Path = TABLES,
) -> list[command.Row]:
    """Replay ``methods`` from ``seeds`` on the quarter table; every replay is written to
    ``folder/quarter-rungs-seeds-<seeds>.parquet``, one method at a time, and a rerun replays only
    the methods that file lacks."""
    table = pd.read_parquet(table_path)
    sizes = table.groupby("seed").config_id.nunique().reindex(list(E.SEEDS), fill_value=0)
    if (sizes != E.SIZE).any():
        raise ConfigError(
            f"the quarter-epoch evidence table has {', '.join(map(str, sizes))} configurations per seed, "
            f"not {E.SIZE}: build it first (python -m research.evidence_table --quarters)"
        )
    everies = sorted({m.every for m in methods} | {1.0})
    views = {s: Views({e: curves(table, s, e) for e in everies}) for s in E.SEEDS}
    out = folder / f"quarter-rungs-seeds-{seeds.start}-{seeds.stop - 1}.parquet"
    done = R.read_runs(out, seeds) if out.exists() else []
    for rungs in methods:
        if rungs.name not in {r.method for r in done}:
            done += replays(views, (rungs,), seeds, workers)
            R.write_runs(out, done)
    taus = {e: float(np.mean([first_rung_tau(v, e) for v in views.values()])) for e in everies}
    order = [m.name for m in methods]
    return summarize(
        sorted((r for r in done if r.method in order), key=lambda r: (order.index(r.method), r.seed)), methods, taus
    )


def main(argv: list[str] | None = None) -> None:
    args = command.parser("subepoch_rungs", __doc__, "seeds").parse_args(argv)
    command.show(run(command.seeds(args.seeds)), args.out)


if __name__ == "__main__":
    command.main(main)
