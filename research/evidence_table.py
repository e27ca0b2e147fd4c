"""``python -m research.evidence_table``: the evidence table, a discrete space trained once so that search methods
can be replayed on it without training (as LCBench, HPOBench and YAHPO do).

:data:`CONFIGURATIONS` (96 of the 540 points of the grid :data:`GRID`, a maximin Latin hypercube
on its levels) are
trained at three latent fractions (:data:`FRACTIONS` of 16 tokens) from two seeds (:data:`SEEDS`),
every epoch to the last (:data:`EPOCHS`, no early stop), so the noise of a configuration is
measured everywhere, not on a subset. Each training is one call of the trainer
(``seqae_core.train``) in a pool of :data:`WORKERS` single-threaded processes; its rows land in a
file of their own under ``--workspace`` when it ends, so a rerun continues and a kill loses at most
the trainings running. Each epoch's validation and test scores (the test pages scored on the
checkpoint early stopping keeps by then: what a sweep stopped at that epoch would return), its
wall seconds and its process CPU-seconds (the replay's currency, honest on a shared machine)
are kept.

The fractions are built in the order of :data:`FRACTIONS` (25% first: the search benchmark's
and the replays' fraction), the first seed of a fraction before its second. Every call rewrites
the published table (``research/tables/evidence.parquet``) and its data card from every
training done so far, the published rows included, so a table built across machines continues
from what was published.

:data:`QUARTERS` is the same trainings at the 25% fraction validated at each quarter of an epoch
(``train.validate_every: 0.25``, ``python -m research.evidence_table --quarters``): a row per validation, with the
validation's own CPU-seconds, so a replay can charge a method for validating as often as its rungs
need and no more (``research.subepoch_rungs``).
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from research import TABLES, command
from seqae_core.config import from_flat
from seqae_core.epoch import EpochRecord
from seqae_core.train import train

TABLE = TABLES / "evidence.parquet"
INPUT_LEN = 16
FRACTIONS = (0.25, 0.125, 0.5)  # latent_len / input_len: 4, 2 and 8 tokens; built in this order
SEEDS = (1, 2)
EPOCHS = 9  # ASHA and Hyperband decide at epochs 1 and 3 (factor 3), or 1, 2 and 4 (factor 2)
PAGES = 10
WORKERS = 2
SIZE = 96  # configurations per fraction

# The larger grid the configurations are drawn from: heads apply to the transformer block only
# (the paper's block has one head), so the grid has 5 x 3 x 3 x 2 x 2 x (1 + 2) = 540 points.
# A grid key's level, and a configuration: each grid key's level.
Level: TypeAlias = str | int | float
Params: TypeAlias = dict[str, Level]
# Config keys over the defaults, as seqae_core.config.from_flat reads them.
Settings: TypeAlias = dict[str, str | int | float | bool]
GRID: dict[str, tuple[Level, ...]] = {
    "model.block": ("paper", "transformer"),
    "train.lr": (3.0e-4, 7.0e-4, 1.5e-3, 3.5e-3, 8.0e-3),
    "model.d_model": (32, 64, 128),
    "model.d_attn": (32, 64, 128),
    "model.layers": (1, 2),
    "model.dropout": (0.0, 0.1),
    "model.heads": (1, 4),
}
KEYS = tuple(GRID)
FIXED: Settings = {  # every training's other settings
    "data.samples": "windows",
    "data.input_len": INPUT_LEN,
    "data.max_pages": PAGES,
    "data.vocab": "corpus",
    "data.test_fraction": 0.1,
    "model.d_ffn": 256,
    "model.residual": True,
    "train.epochs": EPOCHS,
    "train.patience": EPOCHS,
    "train.batch_size": 16,
    "train.lr_final": 1.0e-4,
    "train.lr_schedule": "linear",
    "train.lr_decay_epochs": EPOCHS,
    "train.precision": "auto",
}


@dataclass(frozen=True)
class Recording:
    """Which trainings a table holds and how often they validate."""

    path: Path
    fractions: tuple[float, ...]
    validate_every: float | None  # None: once an epoch
    parts: str  # the workspace folder of its trainings' parts


EPOCHS_RECORDING = Recording(TABLE, FRACTIONS, None, "evidence-table")
QUARTERS = Recording(TABLES / "evidence-quarters.parquet", (0.25,), 0.25, "evidence-table-quarters")

SCHEMA = pa.schema(
    [
        ("config_id", pa.int64()),  # 0 .. SIZE-1, the same configuration at every fraction
        *(
            (k, pa.string() if k == "model.block" else pa.float64() if isinstance(GRID[k][0], float) else pa.int64())
            for k in KEYS
        ),
        ("input_len", pa.int64()),
        ("latent_len", pa.int64()),
        ("latent_dim", pa.int64()),  # each latent token's width (d_model: no narrowing in this table)
        ("latent_fraction", pa.float64()),  # latent_len / input_len
        ("float_share", pa.float64()),  # (latent_len x latent_dim) / (input_len x d_model)
        ("seed", pa.int64()),
        ("epoch", pa.int64()),
        ("kept_epoch", pa.int64()),  # the epoch early stopping keeps, by validation accuracy, up to this one
        ("val_token_accuracy", pa.float64()),
        ("val_loss", pa.float64()),
        ("test_token_accuracy", pa.float64()),  # of the kept checkpoint, on the test pages
        ("test_loss", pa.float64()),
        ("wall_seconds", pa.float64()),  # the epoch's
        ("cpu_seconds", pa.float64()),  # the epoch's process CPU time (one thread: one CPU)
    ]
)
# QUARTERS' rows: one per validation, ``epoch`` the epochs trained (0.25, 0.5, ...), ``kept_epoch``
# likewise, ``cpu_seconds`` the quarter's (its steps and its validation), ``validation_cpu_seconds``
# the validation's share of it (the validation pages and, at a new best, the test pages).
QUARTERS_SCHEMA = pa.schema(
    [
        *(pa.field(f.name, pa.float64()) if f.name in ("epoch", "kept_epoch") else f for f in SCHEMA),
        ("validation_cpu_seconds", pa.float64()),
    ]
)


def schema(recording: Recording) -> pa.Schema:
    return SCHEMA if recording.validate_every is None else QUARTERS_SCHEMA


def grid() -> list[Params]:
    """Every point of :data:`GRID`, the paper block's with one head."""
    points = [dict(zip(KEYS, values)) for values in itertools.product(*GRID.values())]
    return [p for p in points if p["model.block"] == "transformer" or p["model.heads"] == 1]


def _coordinates(points: Sequence[Mapping[str, Level]]) -> np.ndarray:
    """Each point as numbers in [0, 1] per key: a choice's rank among its key's choices (the
    learning rate's are log-spaced already, so ranks are its log scale)."""
    return np.array([[GRID[k].index(p[k]) / (len(GRID[k]) - 1) for k in KEYS] for p in points])


def _latin(block: str, size: int, rng: np.random.Generator) -> list[Params]:
    """``size`` points of ``block`` in which every choice of every key appears equally often (to
    within one), the keys' columns shuffled independently: a Latin hypercube on the grid's levels."""
    columns = {}
    for key, choices in GRID.items():
        levels = (1,) if key == "model.heads" and block == "paper" else choices
        column = [levels[i % len(levels)] for i in range(size)]
        rng.shuffle(column)
        columns[key] = column
    columns["model.block"] = [block] * size
    return [{k: columns[k][i] for k in KEYS} for i in range(size)]


def _score(design: list[Params]) -> tuple[float, float]:
    """The distance between the closest two points, then the mean distance to the nearest point."""
    coords = _coordinates(design)
    distances = np.linalg.norm(coords[:, None] - coords[None], axis=-1) + np.eye(len(design)) * 9
    return float(distances.min()), float(distances.min(axis=1).mean())


def space_filling(size: int, swaps: int = 3000, seed: int = 0) -> list[Params]:
    """``size`` grid points, half of each block, each block's a Latin hypercube on the levels
    (every choice of every key equally often), then improved by swapping two points' values of one
    key where that keeps the closest two points as far apart or farther (Morris and Mitchell's
    maximin design): every choice is equally represented and no two configurations are
    near-copies, which a random subset of this size would have."""
    rng = np.random.default_rng(seed)
    half = size // 2
    design = _latin("paper", half, rng) + _latin("transformer", size - half, rng)
    score = _score(design)
    for _ in range(swaps):
        block = int(rng.integers(2))
        key = KEYS[1 + int(rng.integers(len(KEYS) - 2 + block))]  # heads (the last key) stay 1 in the paper block
        first, second = (int(i) + block * half for i in rng.choice(half, 2, replace=False))
        trial = [dict(p) for p in design]
        trial[first][key], trial[second][key] = design[second][key], design[first][key]
        if (new := _score(trial)) >= score:
            design, score = trial, new
    return sorted(design, key=lambda p: tuple(str(p[k]) for k in KEYS))


CONFIGURATIONS: tuple[Params, ...] = tuple(space_filling(SIZE))


@dataclass(frozen=True)
class Job:
    config_id: int
    fraction: float
    seed: int

    @property
    def name(self) -> str:
        return f"f{round(self.fraction * 1000):04d}-c{self.config_id:03d}-s{self.seed}"

    @property
    def latent_len(self) -> int:
        return round(self.fraction * INPUT_LEN)


def jobs(recording: Recording = EPOCHS_RECORDING) -> list[Job]:
    """Every training, in the order they are built."""
    return [Job(c, f, s) for f in recording.fractions for s in SEEDS for c in range(len(CONFIGURATIONS))]


def settings(job: Job, data_path: str, recording: Recording = EPOCHS_RECORDING) -> Settings:
    """The config keys of ``job``'s training (patience stays in epochs: no early stop either way)."""
    every = {} if recording.validate_every is None else {"train.validate_every": recording.validate_every}
    return {
        **FIXED,
        **CONFIGURATIONS[job.config_id],
        "data.path": data_path,
        "model.latent_len": job.latent_len,
        "train.seed": job.seed,
        **every,
    }


def _train(job: Job, data_path: str, out: Path, recording: Recording = EPOCHS_RECORDING) -> Path:
    """Train ``job`` in this (pool) process and write its rows to ``out``, atomically."""
    torch.set_num_threads(1)
    config = from_flat(settings(job, data_path, recording))
    epochs: list[EpochRecord] = []
    train(config, lambda record, checkpoint: epochs.append(record))
    rows = [row(job, config.model.d_model, e, recording) for e in epochs]
    partial = out.with_suffix(f".{os.getpid()}.tmp")
    pd.DataFrame(rows).to_parquet(partial, index=False)
    partial.rename(out)
    return out


def row(job: Job, d_model: int, epoch: EpochRecord, recording: Recording = EPOCHS_RECORDING) -> command.Row:
    """One validation (an epoch's, by default) of one training, in :func:`schema`'s columns."""
    whole = recording.validate_every is None
    return {
        "config_id": job.config_id,
        **CONFIGURATIONS[job.config_id],
        "input_len": INPUT_LEN,
        "latent_len": job.latent_len,
        "latent_dim": d_model,
        "latent_fraction": job.latent_len / INPUT_LEN,
        "float_share": job.latent_len / INPUT_LEN,
        "seed": job.seed,
        "epoch": int(epoch.epoch) if whole else float(epoch.epoch),
        "kept_epoch": int(epoch.best_epoch) if whole else float(epoch.best_epoch),
        "val_token_accuracy": epoch.val_token_accuracy,
        "val_loss": epoch.val_loss,
        "test_token_accuracy": epoch.test_token_accuracy,
        "test_loss": epoch.test_loss,
        "wall_seconds": epoch.epoch_seconds,
        "cpu_seconds": epoch.epoch_cpu_seconds,
        **({} if whole else {"validation_cpu_seconds": epoch.validation_cpu_seconds}),
    }


def _published_done(table: pd.DataFrame) -> set[str]:
    keys = table[["config_id", "latent_fraction", "seed"]].drop_duplicates()
    return {Job(int(c), float(f), int(s)).name for c, f, s in keys.itertuples(index=False)}


def collect(parts: Path, published: Path = TABLE, recording: Recording = EPOCHS_RECORDING) -> pd.DataFrame:
    """Every training done: the parts in ``parts`` and the published table's, one row per epoch."""
    frames = [pd.read_parquet(p) for p in sorted(parts.glob("*.parquet"))]
    if published.exists():
        old = pd.read_parquet(published)
        have = {p.stem for p in parts.glob("*.parquet")}
        frames.append(
            old[
                [
                    Job(int(c), float(f), int(s)).name not in have
                    for c, f, s in old[["config_id", "latent_fraction", "seed"]].itertuples(index=False)
                ]
            ]
        )
    if not frames:
        return schema(recording).empty_table().to_pandas()
    table = pd.concat(frames, ignore_index=True)
    return table.sort_values(
        ["latent_fraction", "seed", "config_id", "epoch"], ascending=[False, True, True, True], ignore_index=True
    )


def publish(table: pd.DataFrame, out: Path = TABLE, recording: Recording = EPOCHS_RECORDING) -> None:
    """Write the table (Parquet in :func:`schema`) and its data card beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    table[schema(recording).names].to_parquet(out, index=False, schema=schema(recording))
    out.with_suffix(".md").write_text(card(table, recording))


def noise(table: pd.DataFrame) -> pd.DataFrame:
    """Per fraction, the difference between a configuration's two seeds' best validation accuracy:
    its median and 90th percentile (absolute), over the configurations trained from both."""
    best = table.groupby(["latent_fraction", "config_id", "seed"]).val_token_accuracy.max().unstack("seed")
    both = best.dropna()
    if both.shape[1] < 2 or both.empty:
        return pd.DataFrame(columns=["latent_fraction", "configurations", "median_abs_diff", "p90_abs_diff"])
    diff = (both.iloc[:, 0] - both.iloc[:, 1]).abs().groupby("latent_fraction")
    return pd.DataFrame(
        {
            "configurations": diff.size(),
            "median_abs_diff": diff.median().round(4),
            "p90_abs_diff": diff.quantile(0.9).round(4),
        }
    ).reset_index()


def _markdown(frame: pd.DataFrame) -> list[str]:
    columns = list(frame.columns)
    return [
        "| " + " | ".join(columns) + " |",
        "|" + " --- |" * len(columns),
        *("| " + " | ".join(str(v) for v in values) + " |" for values in frame.itertuples(index=False)),
    ]


def card(table: pd.DataFrame, recording: Recording = EPOCHS_RECORDING) -> str:
    trainings = table[["latent_fraction", "config_id", "seed"]].drop_duplicates()
    counts = trainings.groupby(["latent_fraction", "seed"]).size().to_dict()
    done = ", ".join(f"{f:.1%} seed {s}: {n}" for (f, s), n in sorted(counts.items(), reverse=True))
    epochs = table.cpu_seconds.describe() if len(table) else None
    quarters = recording.validate_every is not None
    fractions = recording.fractions
    lines = [
        "# The evidence table" + (", validated at each quarter of an epoch" if quarters else ""),
        "",
        "- **What:** learning curves of a discrete space for replaying search methods without training "
        f"(`python -m research.{'subepoch_rungs' if quarters else 'replay'}`). One row per configuration, latent fraction, "
        f"training seed and {'validation (at each quarter of an epoch)' if quarters else 'epoch'} "
        f"(`research/evidence_table.py`, `{'QUARTERS_SCHEMA' if quarters else 'SCHEMA'}`, documents every column).",
        f"- **Scale:** {SIZE} configurations (a maximin Latin hypercube on the levels of a {len(grid())}-point grid over "
        f"block, 5 learning rates, d_model, d_attn, layers, dropout and heads) x {len(fractions)} latent "
        f"fraction{'s' if len(fractions) > 1 else ''} "
        f"({', '.join(f'{INPUT_LEN}->{round(f * INPUT_LEN)}' for f in sorted(fractions, reverse=True))} tokens) x "
        f"{len(SEEDS)} training seeds x {EPOCHS} epochs = {SIZE * len(fractions) * len(SEEDS)} trainings. "
        f"Done so far: {len(trainings)} trainings ({done or 'none'}), {len(table)} rows.",
        f"- **How:** `python -m research.evidence_table{' --quarters' if quarters else ''} --data ../shared/data/wikipedia-mini "
        f"--workspace DIR`: each training is "
        f"`seqae_core.train` in a pool of {WORKERS} single-threaded processes on consecutive {INPUT_LEN}-token "
        f"windows of the first {PAGES} pages of the offline corpus (10% of the pages held out for test, corpus "
        f"vocabulary), d_ffn 256, residual on, batch 16, lr decaying linearly to 1e-4 over the {EPOCHS} epochs, "
        "no early stop, `train.precision` auto (bf16 autocast only on a CPU with native bf16, else fp32; the "
        "machines are in the tables' README)"
        + (
            ", `train.validate_every` 0.25. `cpu_seconds` is the quarter's process CPU time (its steps and its "
            "validation), `validation_cpu_seconds` the validation's share of it, "
            if quarters
            else ". `cpu_seconds` is the epoch's process CPU time, "
        )
        + "`wall_seconds` its wall time; `test_*` score the checkpoint early stopping keeps by then.",
        *(
            [
                f"- **{'Quarter' if quarters else 'Epoch'} CPU-seconds:** median {epochs['50%']:.2f}, "
                f"range {epochs['min']:.2f}-{epochs['max']:.2f}"
                + (f"; of them validating, median {table.validation_cpu_seconds.median():.2f}." if quarters else ".")
            ]
            if epochs is not None
            else []
        ),
        "- **License:** the measurements are seqae's; the text they were trained on is Wikipedia's "
        "(CC BY-SA 4.0), and none of it is in the table.",
        "",
        "## Noise: |seed 1 - seed 2| of a configuration's best validation accuracy",
        "",
        *_markdown(noise(table)),
        "",
    ]
    return "\n".join(lines)


def build(
    data_path: str,
    workspace: Path,
    workers: int = WORKERS,
    limit: int | None = None,
    recording: Recording = EPOCHS_RECORDING,
) -> pd.DataFrame:
    """Train every training of ``recording`` not done yet (in its folder of ``workspace`` or its
    published table), at most ``limit`` of them, and publish; the table."""
    published = recording.path
    parts = workspace / recording.parts
    parts.mkdir(parents=True, exist_ok=True)
    (parts / "settings.json").write_text(
        json.dumps(
            {
                "grid": {k: list(v) for k, v in GRID.items()},
                "fixed": FIXED,
                "validate_every": recording.validate_every,
                "configurations": list(CONFIGURATIONS),
            },
            indent=1,
        )
    )
    done = {p.stem for p in parts.glob("*.parquet")} | (
        _published_done(pd.read_parquet(published)) if published.exists() else set()
    )
    every = jobs(recording)
    todo = [j for j in every if j.name not in done][:limit]
    print(
        f"evidence table: {len(every) - len([j for j in every if j.name not in done])} of {len(every)} "
        f"trainings done, {len(todo)} to train now",
        flush=True,
    )
    started = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_train, job, data_path, parts / f"{job.name}.parquet", recording): job for job in todo}
        for n, future in enumerate(as_completed(futures), 1):
            future.result()
            elapsed = time.perf_counter() - started
            print(
                f"  {futures[future].name} ({n}/{len(todo)}, {elapsed:.0f} s, "
                f"~{elapsed / n * (len(todo) - n):.0f} s left)",
                flush=True,
            )
            if n % 24 == 0:
                publish(collect(parts, published, recording), published, recording)
    table = collect(parts, published, recording)
    publish(table, published, recording)
    return table


def summary(table: pd.DataFrame) -> list[command.Row]:
    """A row per fraction and seed: trainings, best validation accuracy, CPU-seconds."""
    rows: list[command.Row] = []
    for (fraction, seed), group in table.groupby(["latent_fraction", "seed"]):
        best = group.groupby("config_id").val_token_accuracy.max()
        rows.append(
            {
                "latent": f"{INPUT_LEN}->{round(fraction * INPUT_LEN)}",
                "seed": seed,
                "trainings": len(best),
                "best_val_max": round(float(best.max()), 4),
                "best_val_median": round(float(best.median()), 4),
                "cpu_s": round(float(group.cpu_seconds.sum())),
                "wall_s": round(float(group.wall_seconds.sum())),
                "cpu_s_per_epoch_median": round(float(group.cpu_seconds.median()), 2),
            }
        )
    return rows


def run(data_path: str, workspace: Path, recording: Recording = EPOCHS_RECORDING) -> list[command.Row]:
    table = build(data_path, workspace, recording=recording)
    return summary(table) + [
        {
            "latent": f"{INPUT_LEN}->{round(r.latent_fraction * INPUT_LEN)}",
            "seed": "|1-2|",
            "trainings": r.configurations,
            "noise_median": r.median_abs_diff,
            "noise_p90": r.p90_abs_diff,
        }
        for r in noise(table).itertuples()
    ]


def main(argv: list[str] | None = None) -> None:
    parser = command.parser("evidence_table", __doc__, "data", "workspace")
    parser.add_argument(
        "--quarters",
        action="store_true",
        help="the 25%% fraction validated at each quarter of an epoch (evidence-quarters.parquet)",
    )
    args = parser.parse_args(argv)
    recording = QUARTERS if args.quarters else EPOCHS_RECORDING
    command.show(command.in_workspace(args, lambda workspace: run(command.data(args), workspace, recording)), args.out)


if __name__ == "__main__":
    command.main(main)
