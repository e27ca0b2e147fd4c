"""``seqae bench step``: the training step, variant by variant, against a plain PyTorch loop.

One fixed table: for each block and batch size and each step variant (the plain loop of
:mod:`benchmarks.throughput`; the step as it was before the sync-free step, reproduced here; the
sync-free step; with the fused head; compiled; compiled with CUDA graphs), ms a step (CUDA events after warm-up on a GPU, the
host's clock on a CPU), tokens/s, share of the GPU's bf16 peak, ratio to the plain loop, peak
memory and compile seconds. Then the parity of every head at the BERT vocabulary and the host
syncs a step (``torch.cuda.set_sync_debug_mode`` on a GPU; :mod:`benchmarks.syncs` anywhere).

On a GPU it runs 512 -> 256 tokens in bf16 at batches 16 and 64; on a CPU, 64 -> 32 in fp32 at
batch 16, and the GPU's rows say there is no GPU. It imports only PyTorch, NumPy and seqae_core
(the GPU kit, benchmarks/gpu_kit.sh, carries Liger-Kernel to a machine without a package index).
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import pynvml
import torch
import torch.nn.functional as F

from benchmarks.baseline import BaselineAutoencoder, plain_step
from benchmarks.flops import PEAK_BF16, forward_flops
from benchmarks.rows import AnyRow
from benchmarks.syncs import count_per_step
from benchmarks.timing import median_seconds
from seqae_core.config import Config, from_flat
from seqae_core.loss import GPU_CHUNK_ROWS, IGNORE, HeadPlan, liger_available, linear_cross_entropy, plan_head
from seqae_core.model import ReducingAutoencoder
from seqae_core.step import TrainStep

VOCAB = 30522  # BERT's, the paper's tokenizer
VARIANTS = ("plain loop", "before (syncs)", "sync-free", "+ fused head", "+ compiled", "+ CUDA graphs")


@dataclass(frozen=True)
class Row:
    block: str
    batch: int
    variant: str
    ms: float | None
    tokens_per_s: float | None
    peak_share: float | None  # of the GPU's dense bf16 peak
    vs_plain: float | None
    peak_gib: float | None
    compile_s: float | None
    note: str = ""


def _config(block: str, batch: int, input_len: int, latent_len: int) -> Config:
    return from_flat(
        {
            "data.input_len": input_len,
            "model.latent_len": latent_len,
            "model.block": block,
            "model.heads": 1 if block == "paper" else 4,
            "train.batch_size": batch,
            "train.lr_schedule": "constant",
        }
    )


def _batches(batch: int, length: int, device: torch.device, count: int = 4) -> list[torch.Tensor]:
    """Token batches with the padding real pages have: some windows end early."""
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        tokens = torch.randint(1, VOCAB, (batch, length), generator=generator)
        ends = torch.randint(length // 4, length + 1, (batch,), generator=generator)
        tokens[torch.arange(length)[None, :] >= ends[:, None]] = 0
        batches.append(tokens.to(device))
    return batches


def _before_step(
    model: ReducingAutoencoder,
    optimizer: torch.optim.Optimizer,
    pad_id: int,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> Callable[[torch.Tensor], None]:
    """The step as seqae ran it before: pads indexed out by a boolean mask, the chunked head on
    the rows left, the loss read back before backward, the batch's counts read back as well."""
    plan = plan_head("chunked", next(model.parameters()).device)

    def step(tokens: torch.Tensor) -> None:
        keep = tokens != pad_id  # (b, t)
        with autocast():
            hidden = model.decode(model.encode(tokens))[keep]  # (n, d): a data-dependent shape
            targets = tokens[keep]
            loss_sum, predicted = linear_cross_entropy(hidden, model.head, targets, plan)
        assert predicted is not None
        right = predicted == targets
        per_position = torch.ones_like(keep)
        per_position[keep] = right
        float(loss_sum.detach()), int(right.sum()), int(per_position.all(dim=1).sum())
        loss = loss_sum / max(targets.numel(), 1)
        if not math.isfinite(loss.item()):
            raise FloatingPointError("the loss is not finite")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _variant(
    name: str, config: Config, device: torch.device, autocast: Callable[[], AbstractContextManager[Any]]
) -> tuple[Callable[[torch.Tensor], None], str, torch.nn.Module]:
    """A fresh model of ``config`` and the step of variant ``name`` on it, with a note."""
    torch.manual_seed(0)
    seqae = ReducingAutoencoder(config, VOCAB).to(device)
    if name == "plain loop":
        plain = BaselineAutoencoder(config, VOCAB).to(device)
        plain.model.load_state_dict(seqae.state_dict())
        return plain_step(plain, torch.optim.AdamW(plain.parameters(), lr=1e-4), 0, VOCAB, autocast), "", plain
    optimizer = torch.optim.AdamW(seqae.parameters(), lr=1e-4, fused=True)
    if name == "before (syncs)":
        return _before_step(seqae, optimizer, 0, autocast), "", seqae
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    note, plan = "", HeadPlan("chunked", GPU_CHUNK_ROWS if device.type == "cuda" else 128)
    if name == "+ fused head":
        if device.type == "cuda" and liger_available():
            plan = HeadPlan("fused", GPU_CHUNK_ROWS)
        else:
            plan, note = (
                HeadPlan("dense", 0),
                "dense: " + ("no Liger-Kernel" if device.type == "cuda" else "fused is CUDA-only"),
            )
    compiled = name in ("+ compiled", "+ CUDA graphs")
    if compiled:
        plan, note = HeadPlan("dense", 0), "dense head, inductor"
    graphs = name == "+ CUDA graphs" and device.type == "cuda"
    if graphs:
        note += ", reduce-overhead"
    step = TrainStep(
        seqae,
        optimizer,
        scheduler,
        plan=plan,
        autocast=autocast,
        pad_id=0,
        device=device,
        backend="inductor" if compiled else None,
        mode="reduce-overhead" if graphs else None,
    )
    return step, note, seqae


def measure(
    block: str, batch: int, input_len: int, latent_len: int, device: torch.device, bf16: bool, warmup: int, steps: int
) -> list[Row]:
    config = _config(block, batch, input_len, latent_len)
    batches = _batches(batch, input_len, device)

    def autocast() -> AbstractContextManager[Any]:
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    head, body = forward_flops(config, VOCAB)
    peak = (
        next((v for k, v in PEAK_BF16.items() if k in torch.cuda.get_device_name(0)), None)
        if device.type == "cuda"
        else None
    )
    rows, plain_ms = [], None
    for name in VARIANTS:
        if name == "+ CUDA graphs" and device.type != "cuda":
            rows.append(Row(block, batch, name, None, None, None, None, None, None, "CUDA only"))
            continue
        step, note, _ = _variant(name, config, device, autocast)
        turn = {"i": 0}

        def one(step: Callable[[torch.Tensor], None] = step, turn: dict[str, int] = turn) -> None:
            turn["i"] += 1
            step(batches[turn["i"] % len(batches)])

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        began = time.perf_counter()
        one()  # the first step: a compiled variant compiles here
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        first_s = time.perf_counter() - began
        ms = median_seconds(one, device, warmup, steps) * 1000
        plain_ms = ms if name == "plain loop" else plain_ms
        tokens_per_s = batch * input_len / (ms / 1000)
        rows.append(
            Row(
                block,
                batch,
                name,
                round(ms, 3),
                round(tokens_per_s),
                None if peak is None else round(3 * (head + body) * batch / (ms / 1000) / peak, 4),
                round(plain_ms / ms, 3) if plain_ms else None,
                round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None,
                round(first_s, 1) if name in ("+ compiled", "+ CUDA graphs") else None,
                note,
            )
        )
        print(
            f"  measured {block} {batch} {name}: {rows[-1].ms} ms a step, {rows[-1].vs_plain}x the plain loop",
            flush=True,
        )  # a run cut short by its time limit still shows what it measured
        del step, one  # the variant's model freed before the next one's is built
    return rows


def parity(device: torch.device) -> list[str]:
    """Every head on ``device`` against the plain cross-entropy at the BERT vocabulary, pads
    included: the largest relative error of the loss and of each gradient, fp32 and bf16."""
    torch.manual_seed(0)
    head = torch.nn.Linear(256, VOCAB).to(device)
    hidden = torch.randn(2048, 256, device=device, requires_grad=True)
    targets = torch.randint(0, VOCAB, (2048,), device=device)
    targets[::7] = IGNORE
    plans = [HeadPlan("chunked", 128), HeadPlan("chunked", GPU_CHUNK_ROWS), HeadPlan("dense", 0)]
    if device.type == "cuda" and liger_available():
        plans.append(HeadPlan("fused", GPU_CHUNK_ROWS))
    lines = []
    for bf16 in (False, True):
        results = []
        for plan in [None, *plans]:
            hidden.grad, head.weight.grad, head.bias.grad = None, None, None
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                if plan is None:
                    loss = F.cross_entropy(head(hidden).float(), targets, ignore_index=IGNORE, reduction="sum")
                else:
                    loss, _ = linear_cross_entropy(hidden, head, targets, plan, predict=False)
            loss.backward()
            grads = [g for g in (hidden.grad, head.weight.grad, head.bias.grad) if g is not None]
            assert len(grads) == 3
            results.append((plan, [loss.detach(), *grads]))
        reference = results[0][1]
        for plan, got in results[1:]:
            errors = [
                float((g.float() - r.float()).norm() / r.float().norm().clamp(min=1e-30))
                for g, r in zip(got, reference)
                if g is not None and r is not None
            ]
            bound = 2e-2 if bf16 else 1e-5
            verdict = "ok" if all(e <= bound for e in errors) else "OFF"
            assert plan is not None
            lines.append(
                f"{'bf16' if bf16 else 'fp32'} {plan.kind}/{plan.chunk_rows}: loss {errors[0]:.1e}, "
                f"d hidden {errors[1]:.1e}, d weight {errors[2]:.1e}, d bias {errors[3]:.1e} "
                f"(bound {bound:g}): {verdict}"
            )
    return lines


def sync_counts(device: torch.device, bf16: bool) -> list[str]:
    """Host syncs a step of each seqae variant, counted by the dispatch counter (any device) and,
    on a GPU, by ``torch.cuda.set_sync_debug_mode("warn")``'s warnings."""
    config = _config("paper", 16, 64, 32)
    batches = _batches(16, 64, device, count=1)
    lines = []
    for name in VARIANTS[1:4]:
        step, note, _ = _variant(
            name, config, device, lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
        )
        syncs, ops, by_name = count_per_step(partial(step, batches[0]), steps=3)
        line = f"{name}{f' ({note})' if note else ''}: {syncs:g} syncs a step {dict(by_name)}, {ops:g} operators a step"
        if device.type == "cuda":
            step(batches[0])
            torch.cuda.synchronize(device)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    for _ in range(3):
                        step(batches[0])
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            line += f"; the CUDA sync check: {sum('synchroniz' in str(w.message) for w in caught) / 3:g} a step"
        lines.append(line)
    return lines


def run(warmup: int, steps: int) -> tuple[list[Row], list[str], list[str]]:
    """The table's rows, the parity lines and the sync lines on this machine's device."""
    if torch.cuda.is_available():
        device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = True
        shapes, batches, bf16 = (512, 256), [16, 64], True
    else:
        device, shapes, batches, bf16 = torch.device("cpu"), (64, 32), [16], False
    rows = [
        row
        for block in ("paper", "transformer")
        for batch in batches
        for row in measure(block, batch, *shapes, device, bf16, warmup, steps)
    ]
    if device.type == "cpu":
        rows += [
            Row(block, batch, "(GPU rows)", None, None, None, None, None, None, "no GPU on this machine")
            for block in ("paper", "transformer")
            for batch in (16, 64)
        ]
    return rows, parity(device), sync_counts(device, bf16)


def machine() -> str:
    if not torch.cuda.is_available():
        return f"CPU only, torch {torch.__version__}, {torch.get_num_threads()} threads"
    driver = "?"
    try:
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # NVML is optional here: the driver is then shown as ?
        pass
    return (
        f"{torch.cuda.get_device_name(0)}, driver {driver}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"Liger-Kernel {'yes' if liger_available() else 'no'}"
    )


def format_table(rows: Sequence[AnyRow]) -> str:
    """The rows as a plain table: a share of peak as a percentage, a missing figure as -."""

    def cell(key: str, value: object) -> str:
        if value is None:
            return "-"
        return f"{value:.1%}" if key.endswith("peak_share") and isinstance(value, float) else str(value)

    columns = list(rows[0])
    return "\n".join([" | ".join(columns), *(" | ".join(cell(k, r[k]) for k in columns) for r in rows)])


def suite(warmup: int | None = None, steps: int | None = None) -> list[dict[str, object]]:
    """``seqae bench step``: the machine, the parity and the sync lines printed, the table's rows
    returned. Warm-up and timed steps: 5 and 20 on a GPU, 1 and 3 on a CPU unless given."""
    gpu = torch.cuda.is_available()
    print(f"machine: {machine()}", flush=True)
    rows, parity_lines, sync_lines = run(
        warmup if warmup is not None else 5 if gpu else 1, steps if steps is not None else 20 if gpu else 3
    )
    print(
        "\nparity at the BERT vocabulary (relative error against F.cross_entropy):",
        *parity_lines,
        "\nhost syncs a step (paper block, 64 -> 32, batch 16):",
        *sync_lines,
        sep="\n",
        flush=True,
    )
    return [asdict(row) for row in rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--warmup", type=int, default=None, help="steps before timing (default: 5 on a GPU, 1 on a CPU)"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: 20 on a GPU, 3 on a CPU)")
    args = parser.parse_args(argv)
    print("\n" + format_table(suite(args.warmup, args.steps)), flush=True)


if __name__ == "__main__":
    main()
