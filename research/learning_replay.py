"""``python -m research.learning_replay``: issue 82's search that learns from every trial,
replayed on the evidence table under the corrected protocol (``research/replay.py``, whose
docstring registers the targets).

**The corrected protocol** (every method here): the sweep file declares the grid's keys as
ordered choices where a method says so (:func:`replay.choices`: each numeric key's sorted levels
as the service's ``type: ordered``, which Optuna samples as the level's position: the learning
rate's, the widths' and the heads' levels are log-spaced), each proposal trains the nearest of the table's 96
configurations that no earlier proposal trains (``Method.fresh``: no method re-buys a configuration
it has trained, and the study records the configuration trained, not the proposal), and the
configuration a replay returns is chosen on one training seed's table and scored on the other
seed's test values (cross-seed scoring, :attr:`replay.Trace.returned_cross`), the same table
that sets the targets.

**The arms** (:data:`METHODS`, registered before the first replay), each lever alone, then together:

- the published arms under the corrected protocol: the grid, random search, ASHA + random
  search, and ASHA + TPE over the published categorical space;
- the ordered space: ASHA + TPE over the ordered choices;
- a model fitted on every trial at its first rung (``Method.model == "first-rung"``): Optuna's
  own TPE (and, on fewer seeds, its GPSampler, whose proposals cost about 0.4 CPU-seconds each
  here, some 40 CPU-seconds a replay) over a view of the study in which each trial counts,
  complete, at its value at the first rung as soon as it has one, so a trial ASHA prunes there
  counts as much as one that finishes;
- racing the incumbent (``scheduler: race``, :class:`sweeps.running.schedulers.RacingASHA`): ASHA's
  rungs, a trial going on past one only if it is as good as the best recorded there;
- together: racing with the first-rung model over the ordered space.

**What it reports** (:func:`summarize`): per method, the p90 target's median CPU-seconds over the
grid's with its bootstrap interval (:func:`research.intervals.ratio_interval`), whether that
meets the registered target (at most 0.5x, the interval's upper bound below 0.6x), and per budget
the cross-seed test regret with its bootstrap interval and its difference from ASHA + random
search's, paired by replay seed (the same cost table, targets and scoring table).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from research import TABLES, command
from research import replay as R
from research.intervals import bootstrap_mean, ratio_interval

KIND = "learning-replay"
P90 = R.TARGET_PERCENTILES.index(90)
RATIO_TARGET, UPPER_TARGET = 0.5, 0.6  # the registered target at p90: the median ratio, its interval's upper bound
BASELINE = "asha+random"  # the regret target's reference


def _arm(name: str, sampler: str, scheduler: str = "none", space: str = "ordered", **kwargs: Any) -> R.Method:
    return R.Method(name, sampler, scheduler, space=space, fresh=True, **kwargs)


METHODS = (
    R.Method("grid", "grid"),
    _arm("random", "random"),
    _arm(BASELINE, "random", "asha"),
    _arm("asha+tpe categorical", "tpe", "asha", space="categorical"),  # the published arm, protocol corrected
    _arm("asha+tpe", "tpe", "asha"),  # the ordered space
    _arm("asha+tpe first-rung", "tpe", "asha", model="first-rung"),  # the rung-aware model
    _arm("race+random", "random", "race"),  # racing the incumbent
    _arm("race+tpe", "tpe", "race"),
    _arm("race+tpe first-rung", "tpe", "race", model="first-rung"),  # together
)
# Optuna's GP, with the start-up TPE has in the published replays' second-most common setting (5
# random trials: the GP needs a few points before its kernel's length scales mean anything).
GP_METHODS = (
    _arm("asha+gp first-rung", "gp", "asha", model="first-rung", startup=5),
    _arm("race+gp first-rung", "gp", "race", model="first-rung", startup=5),
)


def run(
    seeds: range,
    fraction: float = R.FRACTION,
    methods: tuple[R.Method, ...] = METHODS,
    folder: Path = TABLES,
    workers: int = R.WORKERS,
) -> list[command.Row]:
    """Replay ``methods`` from ``seeds`` at ``fraction`` (resumably, a method at a time, into
    ``folder/learning-replay-<fraction>-seeds-<first>-<last>.parquet``) and summarize every replay
    of that fraction and seed set that ``folder`` holds."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a fresh proposal's failed stand-in is no news
    folder.mkdir(parents=True, exist_ok=True)
    R.run(seeds, fraction, methods=methods, folder=folder, kind=KIND, workers=workers)
    return summarize(read(folder, fraction, seeds.start // 1000))


def read(folder: Path, fraction: float, seed_set: int) -> list[R.Run]:
    """Every replay of ``fraction`` that ``folder``'s files hold for the seed set ``seed_set``
    (0: seeds 0-999, 1: 1000-1999), each method and seed once."""
    runs: dict[tuple[str, int], R.Run] = {}
    for path in sorted(folder.glob(f"{KIND}-{round(fraction * 1000):04d}-seeds-*.parquet")):
        first, last = (int(n) for n in path.stem.split("-seeds-")[1].split("-"))
        if first // 1000 == seed_set:
            for r in R.read_runs(path, range(first, last + 1)):
                runs[(r.method, r.seed)] = r
    return list(runs.values())


def summarize(runs: list[R.Run]) -> list[command.Row]:
    """A row per method: the p90 target's cost over the grid's (on the seeds both replayed), the
    target met or not, and the cross-seed regret at each budget beside its difference from
    :data:`BASELINE`'s (the seeds both replayed)."""
    by_method = {m: {r.seed: r for r in runs if r.method == m} for m in dict.fromkeys(r.method for r in runs)}
    grid, baseline = by_method.get("grid", {}), by_method.get(BASELINE, {})
    rows = []
    for method, mine in by_method.items():
        costs = [r.trace.costs[P90] for r in mine.values()]
        # against the grid's replays of the same seeds: the same cost tables and targets
        ratio = ratio_interval(costs, [grid[s].trace.costs[P90] for s in mine if s in grid]) if grid else None
        row: command.Row = {
            "method": method,
            "replays": len(mine),
            "seeds": f"{min(mine)}-{max(mine)}",
            "p90_cpu_s_median": R.number_text(float(np.median(costs))),
            "p90_vs_grid": ratio.ratio() if ratio else "",
            "p90_target": (
                "met"
                if ratio and ratio.estimate <= RATIO_TARGET and ratio.high < UPPER_TARGET
                else "missed"
                if ratio
                else ""
            ),
            "reached_p90": f"{np.mean([c < math.inf for c in costs]):.1%}",
        }
        for j, budget in enumerate(R.BUDGETS):
            regret = bootstrap_mean([cross_regret(r, j) for r in mine.values()])
            row[f"regret_{budget:g}x"] = f"{regret.estimate:.2f} [{regret.low:.2f}, {regret.high:.2f}]"
            shared = sorted(set(mine) & set(baseline))
            if shared and method != BASELINE:
                gap = bootstrap_mean([cross_regret(mine[s], j) - cross_regret(baseline[s], j) for s in shared])
                row[f"vs_{BASELINE}_{budget:g}x"] = f"{gap.estimate:+.2f} [{gap.low:+.2f}, {gap.high:+.2f}]"
        rows.append(row)
    return rows


def cross_regret(run: R.Run, budget: int) -> float:
    """Points of test accuracy below the scoring table's best of what ``run`` returned at ``budget``,
    scored on the other training seed's table."""
    return 100 * (run.best_cross - run.trace.returned_cross[budget])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m research.learning_replay", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", required=True, help="A-B, replay seeds (0-999 or 1000-1999, or a part of one)")
    parser.add_argument("--fraction", type=float, default=R.FRACTION, help="the latent fraction (0.125, 0.25, 0.5)")
    parser.add_argument("--gp", action="store_true", help="replay the GP arms (slow) instead of the others")
    parser.add_argument(
        "--only", help="name,name: replay only these arms, an underscore for each space in a name (race+tpe_first-rung)"
    )
    parser.add_argument("--workers", type=int, default=R.WORKERS, help="processes replaying at once")
    parser.add_argument("--folder", type=Path, default=TABLES, help="where the replay files are written and read")
    args = parser.parse_args(argv)
    first, last = (int(n) for n in args.seeds.split("-"))
    methods: tuple[R.Method, ...] = GP_METHODS if args.gp else METHODS
    if args.only:
        methods = tuple(m for m in methods if m.name in {n.replace("_", " ") for n in args.only.split(",")})
    rows = run(range(first, last + 1), R.known(args.fraction), methods, args.folder, args.workers)
    for row in rows:
        print(" | ".join(f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
