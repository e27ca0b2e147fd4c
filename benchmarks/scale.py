"""The paper's Fig. 3 at full scale, on paper: measured per-trial figures times arithmetic.

Measured here:
    step rate     a training step (batch 16) of each input length's cells on this machine's device,
                  as FLOP/s achieved; every cell's time is its FLOPs at its length's rate
    rows          what one trial writes per epoch and once into MLflow and Optuna, counted in the
                  SQLite databases of a real two-trial sweep of ``paper_fig3.yaml`` (2 and 4 epochs)
    bytes         a checkpoint record's bytes per parameter, from the same sweep's trial stores
Arithmetic: 1.9 M pages split 80/20, one sample per page (``first``), 20 epochs (the paper's
cap; patience 5 can only shorten it) or ASHA's expected epochs, matmul FLOPs per sample from
``flops.forward_flops`` (training 3x forward, validation 1x), and an H100's dense bf16
peak, which bounds any GPU's time from below. On a GPU the measured step rate also gives the GPU's
share of its peak, the GPU-hours at that share and the figure's wall time on 8 GPUs; on a CPU
those rows say they need a GPU.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import TypedDict

import torch

from benchmarks.data_scale import PAPER_PAGES
from benchmarks.flops import PEAK_BF16, forward_flops
from seqae_core import metrics as M
from seqae_core.config import Config
from seqae_core.device import autocast
from seqae_core.loss import plan_head
from seqae_core.model import ReducingAutoencoder
from seqae_core.step import TrainStep
from sweeps.results.eta import asha_epochs
from sweeps.results.plan import median_step_seconds
from sweeps.spec import sweep as spec_lib
from sweeps.spec.sweep import cell_configs

STUDY = Path(__file__).resolve().parents[1] / "sweeps" / "studies" / "paper_fig3.yaml"
VOCAB = 30522  # bert-base-uncased: the paper scores every id (data.vocab: tokenizer)


def step_flop_rate(config: Config, steps: int = 3) -> float:
    """Training FLOP/s of one batch-16 step of ``config``'s model on this machine's device."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = ReducingAutoencoder(config, VOCAB).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(1, VOCAB, (16, config.data.input_len), device=device)
    train_step = TrainStep(
        model,
        optimizer,
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
        plan=plan_head(config.train.head, device),
        autocast=lambda: autocast(config, device),
        pad_id=0,
        device=device,
    )

    def step() -> None:
        train_step(tokens)

    head, body = forward_flops(config, VOCAB)
    return 16 * 3 * (head + body) / median_step_seconds(step, steps)


def measured_gpu_rows(
    rates: dict[int, float],
    epoch_flops: list[float],
    here_s: list[float],
    cells: list[Config],
    max_t: int,
    asha: float,
    gpus: int = 8,
) -> list[tuple[str, str | float]]:
    """What the 100%-of-peak floor leaves out: this GPU's measured share of its bf16 peak at each
    input length, the figure's GPU-hours at the measured rates, and its wall time on ``gpus`` of
    this GPU, one trial on each at a time (fractional GPUs can only shorten it). On a CPU each
    figure is named, with the word that it needs a GPU."""
    if not torch.cuda.is_available():
        return [
            (f"{name} (run seqae bench scale on a GPU)", "needs a GPU")
            for name in (
                "share of the GPU's bf16 peak reached by a batch-16 step, per input length",
                "GPU-hours at the measured rates, 20 epochs and ASHA",
                f"wall hours of Fig. 3 on {gpus} of the GPU, 20 epochs",
            )
        ]
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    rows: list[tuple[str, str | float]] = []
    if peak is not None:
        rows += [(f"share of the {name}'s bf16 peak at {n} tokens", f"{rate / peak:.1%}") for n, rate in rates.items()]
    rows += [
        (f"GPU-hours on the {name} at the measured rates, {label}", round(sum(here_s) * epochs / 3600, 1))
        for label, epochs in (("20 epochs", max_t), ("ASHA", asha))
    ]
    wall = max(sum(here_s) * max_t / gpus, max(here_s) * max_t) / 3600
    rows.append((f"wall hours of Fig. 3 on {gpus} {name}s at the measured rates, 20 epochs", round(wall, 1)))
    return rows


# A row of ``seqae bench scale``: a figure of Fig. 3 at full scale, its value, and where it comes from
# (the functional form, as "from" is a keyword).
Figure = TypedDict("Figure", {"figure": str, "value": str | float, "from": str})


def tracking_rows(data_path: str) -> dict[str, float]:
    """Rows one trial writes into MLflow and Optuna, once and per epoch, and a checkpoint record's
    bytes per parameter, from a real sweep of the study with two trials of 2 and 4 epochs."""
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        sets = [
            f"data.path={data_path}",
            "data.samples=windows",
            "data.max_pages=5",
            "model.d_model=16",
            "model.d_attn=16",
            "grid.data.input_len=[16]",
            "grid.model.latent_fraction=[0.5]",
            "grid.train.epochs=[2,4]",
            "max_concurrent=1",
            "resources.cpu=1",
        ]
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "seqae",
                "sweep",
                "run",
                str(STUDY),
                "--name",
                "rows",
                "--workspace",
                str(ws),
                *[a for s in sets for a in ("--set", s)],
            ],
            capture_output=True,
            text=True,
            env=os.environ.copy(),
        )
        if run.returncode != 0:
            raise RuntimeError(f"the benchmark sweep failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
        mlflow_rows = _rows_per_trial(
            ws / "mlflow.db",
            ("SELECT CAST(value AS INTEGER), run_uuid FROM tags WHERE key = 'seqae.trial'"),
            {
                "metrics": "run_uuid",
                "latest_metrics": "run_uuid",
                "params": "run_uuid",
                "tags": "run_uuid",
                "runs": "run_uuid",
                "inputs": "destination_id",
            },
        )
        optuna_rows = _rows_per_trial(
            ws / "optuna.db",
            "SELECT number, trial_id FROM trials",
            {
                "trials": "trial_id",
                "trial_values": "trial_id",
                "trial_intermediate_values": "trial_id",
                "trial_params": "trial_id",
                "trial_user_attributes": "trial_id",
                "trial_system_attributes": "trial_id",
                "trial_heartbeats": "trial_id",
            },
        )
        with sqlite3.connect(ws / "mlflow.db") as con:
            # the loss curve's points: counted apart, as their number per epoch grows with the data
            curve = dict(
                con.execute(
                    "SELECT CAST(t.value AS INTEGER), COUNT(*) FROM tags t JOIN metrics m ON m.run_uuid = t.run_uuid "
                    f"WHERE t.key = 'seqae.trial' AND m.key = '{M.TRAIN_LOSS_STEPS}' GROUP BY t.value"
                )
            )
            mlflow_rows = {n: rows - curve.get(n, 0) for n, rows in mlflow_rows.items()}
            epochs = dict(
                con.execute(
                    "SELECT CAST(t.value AS INTEGER), MAX(m.step) FROM tags t JOIN metrics m ON m.run_uuid = t.run_uuid "
                    f"WHERE t.key = 'seqae.trial' AND m.key = '{M.VAL_TOKEN_ACCURACY}' GROUP BY t.value"
                )
            )
        epoch_bytes, best_bytes = _record_bytes(ws / "sweeps" / "rows" / "trials")
        params = sum(
            p.numel() for p in ReducingAutoencoder(cell_configs(spec_lib.load(STUDY, sets))[0], _vocab(ws)).parameters()
        )
    short, long = sorted(epochs, key=epochs.__getitem__)  # the trials of 2 and of 4 epochs
    assert (epochs[short], epochs[long]) == (2, 4), epochs
    out: dict[str, float] = {}
    for system, rows in (("mlflow", mlflow_rows), ("optuna", optuna_rows)):
        out[f"{system}_rows_per_epoch"] = (rows[long] - rows[short]) / 2
        out[f"{system}_rows_once"] = rows[short] - 2 * out[f"{system}_rows_per_epoch"]
    out["epoch_record_bytes_per_param"] = epoch_bytes / params
    out["best_record_bytes_per_param"] = best_bytes / params
    return out


def _rows_per_trial(db: Path, trials: str, tables: dict[str, str]) -> dict[int, int]:
    """Rows per trial number summed over ``tables``; ``trials`` selects (number, key) pairs and
    each table names the column that holds the key."""
    with sqlite3.connect(db) as con:
        keys = dict(con.execute(trials))
        present = {t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        counts: Counter[str] = Counter()
        for table, column in tables.items():
            if table in present:
                counts.update(dict(con.execute(f"SELECT {column}, COUNT(*) FROM {table} GROUP BY {column}")))
    return {number: counts[key] for number, key in keys.items()}


def _record_bytes(trials: Path) -> tuple[float, float]:
    """Bytes of one epoch record and of one best-model record, over every trial's store."""

    def mean(kind: str) -> float:
        sizes = [sum(f.stat().st_size for f in d.iterdir()) for d in trials.glob(f"*/{kind}-*")]
        return sum(sizes) / len(sizes)

    return mean("epoch"), mean("best")


def _vocab(ws: Path) -> int:
    manifest = next((ws / "cache").glob("*/manifest.json"))
    return int(json.loads(manifest.read_text())["vocab_size"])


def run(data_path: str, gpus: tuple[int, ...] = (8, 15, 60)) -> list[Figure]:
    spec = spec_lib.load(STUDY)
    cells = cell_configs(spec)
    train_samples = PAPER_PAGES * (1 - cells[0].data.val_fraction)
    val_samples = PAPER_PAGES * cells[0].data.val_fraction
    # FLOP/s measured at each input length (latent at half), applied to that length's ten cells.
    rates = {
        n: step_flop_rate(next(c for c in cells if c.data.input_len == n and c.latent_len * 2 == n))
        for n in sorted({c.data.input_len for c in cells})
    }
    epoch_flops = [
        3 * sum(forward_flops(c, VOCAB)) * train_samples + sum(forward_flops(c, VOCAB)) * val_samples for c in cells
    ]
    here_s = [f / rates[c.data.input_len] for f, c in zip(epoch_flops, cells)]
    peak = PEAK_BF16["H100"]
    h100_s = [f / peak for f in epoch_flops]  # at 100% of the peak: no GPU is faster
    max_t = cells[0].train.epochs
    asha = asha_epochs(max_t, spec.scheduler.grace_period, spec.scheduler.reduction_factor)
    rows_at = tracking_rows(data_path)
    params = [sum(p.numel() for p in ReducingAutoencoder(c, VOCAB).parameters()) for c in cells]
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"{torch.get_num_threads()}-core CPU"

    out: list[Figure] = []

    def say(figure: str, value: str | float, source: str) -> None:
        out.append({"figure": figure, "value": value, "from": source})

    for n, rate in rates.items():
        say(f"training FLOP/s at {n} tokens on this {device}", f"{rate:.3g}", "measured (median of 3 steps)")
    say("cells; epochs each (no ASHA; patience can only shorten it)", f"{len(cells)}; {max_t}", "paper_fig3.yaml")
    say(
        f"expected epochs per trial under ASHA (grace {spec.scheduler.grace_period}, factor {spec.scheduler.reduction_factor})",
        round(asha, 3),
        "arithmetic",
    )
    total_flops = sum(epoch_flops) * max_t
    say("FLOPs, whole figure (train 3x + validation 1x forward)", f"{total_flops:.3g}", "arithmetic")
    for label, epochs in (("20 epochs", max_t), ("ASHA", asha)):
        say(f"device-hours on this {device}, {label}", round(sum(here_s) * epochs / 3600), "measured rate x FLOPs")
        say(
            f"H100-hours at 100% of bf16 peak, {label} (a lower bound)",
            round(sum(h100_s) * epochs / 3600, 1),
            "arithmetic",
        )
    longest = max(h100_s) * max_t / 3600
    for g in gpus:
        wall = max(sum(h100_s) * max_t / 3600 / g, longest)
        say(
            f"wall hours on {g} H100s at 100% peak, 20 epochs (the longest cell bounds it)",
            round(wall, 1),
            "arithmetic",
        )
    for figure, value in measured_gpu_rows(rates, epoch_flops, here_s, cells, max_t, asha):
        say(figure, value, "measured rate x FLOPs" if torch.cuda.is_available() else "needs a GPU")
    per_param = rows_at["epoch_record_bytes_per_param"] + rows_at["best_record_bytes_per_param"]
    say(
        "checkpoint bytes per epoch, largest cell (epoch + best record)",
        f"{max(params) * per_param:.3g}",
        "measured bytes/param x params",
    )
    say(
        "checkpoint bytes/s into storage at most (all cells at once, each at 100% H100 peak)",
        f"{sum(p * per_param / s for p, s in zip(params, h100_s)):.3g}",
        "measured bytes/param x arithmetic",
    )
    say(
        "checkpoint bytes kept, whole figure (2 epoch records + 1 best per trial)",
        f"{sum(params) * (2 * rows_at['epoch_record_bytes_per_param'] + rows_at['best_record_bytes_per_param']):.3g}",
        "measured bytes/param x params",
    )
    # the loss curve: a point every train.log_every_steps steps of batch 16
    curve = [math.ceil(train_samples / c.train.batch_size / c.train.log_every_steps) for c in cells]
    rows_at["mlflow_rows_per_epoch"] += sum(curve) / len(curve)
    say(f"loss-curve points per trial-epoch (every {cells[0].train.log_every_steps} steps)", max(curve), "arithmetic")
    for system in ("mlflow", "optuna"):
        per_epoch, once = rows_at[f"{system}_rows_per_epoch"], rows_at[f"{system}_rows_once"]
        say(
            f"{system} rows per trial: once + per epoch",
            f"{once:.0f} + {per_epoch:.0f}",
            "measured" + (" + the curve's points" if system == "mlflow" else ""),
        )
        say(f"{system} rows, whole figure at 20 epochs", round(len(cells) * (once + per_epoch * max_t)), "arithmetic")
        # The shortest cell-epoch at the GPU's peak, with every cell running at once: no faster rate exists.
        say(
            f"{system} rows/s at most (all cells at once, each at 100% H100 peak)",
            round(sum(per_epoch / s for s in h100_s), 2),
            "arithmetic",
        )
    say("MLflow runs", len(cells) + 1, "one per trial and the sweep's")
    return out
