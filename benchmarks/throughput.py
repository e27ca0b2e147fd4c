"""Training tokens/s of seqae against a plain PyTorch implementation of the same math, and the
quickstart's settings against the path main had before them.

The baseline (:mod:`benchmarks.baseline`) is what one writes straight from the paper, with
PyTorch's default AdamW; seqae's side is the trainer's own step (:class:`seqae_core.step.TrainStep`).
Both have the same parameters, initial values and batches; only the computation differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.baseline import BaselineAutoencoder, plain_step
from benchmarks.flops import head_share, mfu
from seqae_core import data as data_lib
from seqae_core.config import Config, from_flat
from seqae_core.device import describe_precision
from seqae_core.loss import plan_head
from seqae_core.model import ReducingAutoencoder
from seqae_core.step import TrainStep
from seqae_core.train import train
from sweeps.results.plan import median_step_seconds
from sweeps.spec import sweep as spec_lib


@dataclass
class Case:
    input_len: int
    latent_len: int
    block: str
    precision: str  # fp32 or bf16 (autocast), the same for both implementations


def _config(case: Case, batch_size: int) -> Config:
    return from_flat(
        {
            "data.input_len": case.input_len,
            "model.latent_len": case.latent_len,
            "model.block": case.block,
            "model.heads": 1 if case.block == "paper" else 4,
            "train.batch_size": batch_size,
        }
    )


def measure(case: Case, batches: torch.Tensor, pad_id: int, vocab_size: int, steps: int) -> dict[str, Any]:
    """tokens/s of both implementations on the same batches (n, b, t)."""
    config = _config(case, batches.shape[1])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=case.precision == "bf16")
    batches = batches.to(device)
    torch.manual_seed(0)
    seqae = ReducingAutoencoder(config, vocab_size).to(device)
    baseline = BaselineAutoencoder(config, vocab_size).to(device)
    baseline.model.load_state_dict(seqae.state_dict())
    opt_seqae = torch.optim.AdamW(seqae.parameters(), lr=1e-4, fused=True)
    train_step = TrainStep(
        seqae,
        opt_seqae,
        torch.optim.lr_scheduler.LambdaLR(opt_seqae, lambda s: 1.0),
        plan=plan_head("auto", device),
        autocast=lambda: autocast,
        pad_id=pad_id,
        device=device,
    )
    opt_base = torch.optim.AdamW(baseline.parameters(), lr=1e-4)
    state = {"i": 0}

    def next_batch() -> torch.Tensor:
        state["i"] += 1
        return batches[state["i"] % len(batches)]

    def seqae_step() -> None:
        train_step(next_batch())

    plain = plain_step(baseline, opt_base, pad_id, vocab_size, lambda: autocast)

    def baseline_step() -> None:
        plain(next_batch())

    # Alternate the two a few times so that drift in the machine's speed hits both alike.
    seqae_s, base_s = [], []
    for _ in range(3):
        base_s.append(median_step_seconds(baseline_step, steps))
        seqae_s.append(median_step_seconds(seqae_step, steps))
    tokens = batches.shape[1] * batches.shape[2]
    seqae_tps = tokens / sorted(seqae_s)[1]
    base_tps = tokens / sorted(base_s)[1]
    return {
        "config": f"{case.input_len}->{case.latent_len}",
        "block": case.block,
        "precision": case.precision,
        "seqae_tokens_per_s": round(seqae_tps, 1),
        "baseline_tokens_per_s": round(base_tps, 1),
        "speedup": round(seqae_tps / base_tps, 3),
        "head_share": round(head_share(config, vocab_size), 3),
        "mfu": None if (m := mfu(config, vocab_size, seqae_tps)) is None else round(m, 3),
    }


def real_batches(path: str, input_len: int, batch_size: int, count: int) -> tuple[torch.Tensor, int, int]:
    """``count`` batches of real Wikipedia windows."""
    config = from_flat(
        {"data.path": path, "data.samples": "windows", "data.input_len": input_len, "data.max_pages": 200}
    )
    splits = data_lib.load(config.data)
    rows = splits.train[: count * batch_size]
    tokens = splits.batch(rows).view(count, batch_size, input_len)
    return tokens, splits.pad_id, splits.vocab_size


def run(
    path: str, shapes: list[tuple[int, int]], blocks: list[str], precisions: list[str], steps: int
) -> list[dict[str, Any]]:
    rows = []
    for input_len, latent_len in shapes:
        batches, pad_id, vocab_size = real_batches(path, input_len, 16, 8)
        for block in blocks:
            for precision in precisions:
                rows.append(measure(Case(input_len, latent_len, block, precision), batches, pad_id, vocab_size, steps))
    return rows


QUICKSTART = Path(__file__).resolve().parents[1] / "sweeps" / "studies" / "quickstart.yaml"
# Its best trial's widths; the learning rate stays at the default, the same on both paths.
PINNED = ["model.d_model=128", "model.d_attn=64"]
# main before the quickstart opted into its levers: full fp32, the tokenizer's whole vocabulary, d_ffn 1024.
BEFORE = ["train.precision=fp32", "data.vocab=tokenizer", "model.d_ffn=1024"]


def quickstart_paths(path: str, cache_dir: Path | None = None) -> list[dict[str, Any]]:
    """Train the quickstart's trial (its sweep file's base config) for its 3 epochs as the file
    sets it and as main trained it before, one thread each as a sweep trial gets (resources.cpu:
    1), and compare training tokens/s and accuracy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    try:
        for label, levers in (("before (fp32, bert vocab)", BEFORE), ("quickstart (its sweep file)", [])):
            spec = spec_lib.load(QUICKSTART, [f"data.path={path}", *PINNED, *levers])
            config = from_flat(spec.base)
            result = train(config, cache_dir=cache_dir, device="cpu")
            rows.append(
                {
                    "config": "64->32 quickstart",
                    "path": label,
                    "precision": describe_precision(config, torch.device("cpu")),
                    "vocab": len(data_lib.load(config.data, cache_dir).token_ids),
                    "d_ffn": config.model.d_ffn,
                    "tokens_per_s": round(result["tokens_per_s"], 1),
                    "val_token_accuracy_3_epochs": round(result["val_token_accuracy"], 4),
                }
            )
    finally:
        torch.set_num_threads(threads)
    before = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup_vs_before"] = round(row["tokens_per_s"] / before, 2)
    return rows
