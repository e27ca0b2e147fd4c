"""``python -m research.pack_replay``: what proposing trials in fused packs costs a search, replayed on
the evidence table against proposing one at a time.

``resources.fuse: K`` trains up to K trials that share every shape-setting key as one batched
model in one Tune trial, a pack; each member stays its own Optuna trial. **How a pack's proposals
are made** (the service's "a pack per shape drawn first"): the first member is the sweep's sampler's
own proposal (``study.ask()``); each of the other K-1 is asked with that proposal's shape fixed,
``optuna.samplers.PartialFixedSampler`` over the sweep's sampler with every key but
``seqae_core.config.FREE_KEYS`` (the learning rate, its schedule, weight decay, seed, patience) fixed, so only
the free keys are sampled, the earlier members pending (TPE as the studies pin it has
``constant_liar``, so it sees them as running). ASHA judges each member on its own; a stopped
member leaves the pack at that epoch's end and the pack goes on with the others, taking no new
one; when the last has left, the worker asks a new pack of K.

**The replay** (``replay.replay`` with ``Method.pack``): as ``python -m research.replay`` replays ASHA
with random search and with TPE (the service's sampler and ``ResumableASHA``, :data:`replay.WORKERS`
one-CPU workers, the cross-fitted targets, a target's cost the CPU-seconds spent when an epoch
reaching it ends, the same replay seeds), except that each worker runs a pack at a time: its
members train in lockstep, a pack's epoch costs the sum of its members' epoch CPU-seconds from
the table, and every member's epoch ends, and is reported to Optuna and ASHA, when the pack's
does. Each member trains the table's configuration nearest its proposal, as every proposal of the
replay does: the table holds one or two configurations of each shape it has, so a pack's members
train its shape where the table has it at their learning rate and a neighbour's where it does not.

**Not modelled:** fusing's own speed-up (one batched model for K trainings; ``seqae bench fuse``
measures it). The replay measures only the search's side: K proposals made at once, from less
evidence and at one shape, and packs that shrink rather than refill. A pack's cost here is what
its members would cost one after another; a speed-up of s divides the packed method's costs by
about s.

**Statistics**: per method and target, as ``replay.summarize`` has them, and each packed method's
ratio of median costs to the same sampler's one at a time, from the same replay seeds, with the
paired bootstrap interval (``intervals.paired_ratio_interval``). The one-at-a-time replays are read
from ``replay-<fraction>-seeds-*.parquet`` where one holds every seed asked for, else replayed
here; the packed ones are written to ``pack-replay-<fraction>-seeds-<first>-<last>.parquet``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from research import TABLES, command
from research import evidence_table as E
from research import replay as R
from research.intervals import paired_ratio_interval
from seqae_errors import ConfigError

PACK = 4  # the grid's one free key, the learning rate, has 5 levels: a pack of more must repeat one
# ASHA with random search (the studies') and with TPE (where a file names no sampler), one at a time
ONE_AT_A_TIME = tuple(m for m in R.METHODS if m.name in ("asha+random", "asha+tpe"))


def packed(method: R.Method, pack: int) -> R.Method:
    """``method`` proposing and training ``pack`` trials at a time."""
    return dataclasses.replace(method, name=f"{method.name} packs of {pack}", pack=pack)


def read_alone(folder: Path, fraction: float, seeds: range, method: R.Method) -> list[R.Run]:
    """``method``'s replays from ``seeds``, from the first replay file of ``fraction`` in ``folder``
    that has every one of them; none if none has."""
    for path in sorted(folder.glob(f"replay-{round(fraction * 1000):04d}-seeds-*.parquet")):
        bounds = re.search(r"seeds-(\d+)-(\d+)\.parquet$", path.name)
        if bounds and int(bounds[1]) <= seeds.start and seeds.stop - 1 <= int(bounds[2]):
            runs = [r for r in R.read_runs(path, seeds) if r.method == method.name]
            if runs:
                return runs
    return []


def summarize(runs: list[R.Run], pairs: list[tuple[R.Method, R.Method]]) -> list[command.Row]:
    """Per target, each one-at-a-time method's row and its packed method's, with the packed
    method's ratio of median costs to it (by replay seed); then the regret at each budget."""
    by_method = {
        m: sorted((r for r in runs if r.method == m), key=lambda r: r.seed)
        for m in dict.fromkeys(r.method for r in runs)
    }
    rows: list[command.Row] = []
    for i in range(len(R.TARGET_PERCENTILES)):
        for alone, pack in pairs:
            mine, theirs = by_method[pack.name], by_method[alone.name]
            assert [r.seed for r in mine] == [r.seed for r in theirs], "paired by replay seed"
            ratio = paired_ratio_interval([r.trace.costs[i] for r in mine], [r.trace.costs[i] for r in theirs])
            rows += [
                R.cost_row(theirs, i, {"vs_one_at_a_time": ""}),
                R.cost_row(mine, i, {"vs_one_at_a_time": ratio.ratio()}),
            ]
    rows += [R.regret_row(by_method[m.name], j) for j in range(len(R.BUDGETS)) for pair in pairs for m in pair]
    return rows


def run(
    seeds: range,
    pack: int = PACK,
    fraction: float = R.FRACTION,
    table_path: Path = E.TABLE,
    workers: int = R.WORKERS,
    methods: tuple[R.Method, ...] = ONE_AT_A_TIME,
    folder: Path = TABLES,
) -> list[command.Row]:
    """Replay each of ``methods`` in packs of ``pack`` from ``seeds`` (in a pool of ``workers``
    processes) on the evidence table at ``fraction``, beside the same method one at a time; every
    replay made here is written to ``folder/pack-replay-<fraction>-<seeds>.parquet``, a method at
    a time, and a rerun replays only what that file and the replay files lack."""
    tables = R.tables_at({R.known(fraction)}, table_path)[fraction]
    out = R.runs_file(folder, "pack-replay", fraction, seeds)
    done = R.read_runs(out, seeds) if out.exists() else []
    pairs = [(m, packed(m, pack)) for m in methods]
    runs: list[R.Run] = []
    for method in (m for pair in pairs for m in pair):
        mine = [r for r in done if r.method == method.name] or (
            read_alone(folder, fraction, seeds, method) if method.pack == 1 else []
        )
        if not mine:
            mine = R.replays(tables, (method,), seeds, workers)
            done += mine
            R.write_runs(out, done)
        runs += mine
    return summarize(runs, pairs)


def main(argv: list[str] | None = None) -> None:
    parser = command.parser("pack_replay", __doc__, "seeds")
    parser.add_argument(
        "--pack",
        type=int,
        default=PACK,
        metavar="K",
        help="the trials a fused pack proposes and trains together (default 4)",
    )
    parser.add_argument(
        "--fraction",
        type=float,
        default=R.FRACTION,
        help="the evidence table's latent fraction to replay on (0.5, 0.25 or 0.125; default 0.25)",
    )
    args = parser.parse_args(argv)
    if args.pack < 2:
        raise ConfigError(
            f"--pack {args.pack} is not a pack: pack_replay compares packs of 2 or more trials with one at a time"
        )
    command.show(run(command.seeds(args.seeds), args.pack, args.fraction), args.out)


if __name__ == "__main__":
    command.main(main)
