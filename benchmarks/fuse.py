"""``seqae bench fuse``: K trials of one shape trained as one pack (:mod:`seqae_core.fused`, as
``resources.fuse`` and ``train.repeats`` train them) against the same K trials as fractional GPUs
(K processes sharing the device at once, :mod:`benchmarks.fractional`, as K Ray Tune trials of
``resources.gpu: 1/K`` run) and one after another.

For each size and K: the aggregate training tokens/s of the K members (each member its own batch of
b x t tokens a step), the three ways alternated three times so that drift in the machine's speed
hits all alike (each way's fastest measurement counts). One after another and fused: the median
round (each member one step) of five after a warm-up round. Fractional: from a common start, after
each process's two warm-up steps, until the last of the K processes has taken ten steps. On a GPU
also each way's peak memory (``torch.cuda.max_memory_allocated``, the K processes' summed; a CPU's is
not measured) and the share of the GPU's dense bf16 peak that the fused and fractional matmul FLOPs
reach (:func:`benchmarks.flops.mfu`, summed over the pack). CUDA events time a GPU's rounds,
``time.perf_counter`` a CPU's and the fractional processes'. Synthetic batches, with the padding
real windows have, so no data is needed: only the shapes matter to the speed.

The sizes and K differ by device: on a GPU the paper's widths at 512 -> 256 and 64 -> 32 with BERT's
vocabulary, both blocks, K up to 16; on a CPU the sizes it trains, K up to 8 (a CPU round of the
paper's 512 -> 256 at K = 16 would take minutes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from benchmarks.flops import mfu
from benchmarks.fractional import Job, Processes, autocast_for, device_here, member_batch, member_model, trial_step
from benchmarks.rows import Cell, Settings
from benchmarks.timing import median_seconds
from seqae_core.config import Config, from_flat
from seqae_core.fused import Pack
from seqae_core.loss import plan_head
from seqae_core.schedule import Schedule


@dataclass(frozen=True)
class Size:
    name: str
    settings: Settings
    vocab: int


SIZES = (
    # The tests' tiny model (tests/conftest.py's TINY), with the corpus vocabulary of its six pages.
    Size(
        "tiny 16->8 (tests)",
        {
            "data.input_len": 16,
            "model.block": "transformer",
            "model.d_model": 32,
            "model.d_attn": 32,
            "model.heads": 2,
            "model.d_ffn": 64,
            "train.batch_size": 32,
        },
        3_549,
    ),
    # The quickstart's trial (sweeps/studies/quickstart.yaml with its best widths, d_model 128, d_attn 64),
    # what a CPU trains: the transformer block, 64 -> 32, batch 16, and the corpus vocabulary of its
    # 36 pages of the mini Wikipedia (9,269 ids).
    Size(
        "quickstart 64->32 d128 a64",
        {
            "data.input_len": 64,
            "model.latent_len": 32,
            "model.block": "transformer",
            "model.heads": 4,
            "model.d_ffn": 512,
            "model.d_model": 128,
            "model.d_attn": 64,
            "train.batch_size": 16,
        },
        9_269,
    ),
    # The paper's widths and block at 64 -> 32, batch 16, with the quickstart's corpus vocabulary
    # (data.vocab=corpus): BERT's 30,522 would make a CPU's round of K=8 take half a minute.
    Size(
        "paper 64->32 d256 a512",
        {
            "data.input_len": 64,
            "model.latent_len": 32,
            "model.d_model": 256,
            "model.d_attn": 512,
            "train.batch_size": 16,
        },
        9_269,
    ),
)
PACKS = (1, 2, 4, 8)
BERT_VOCAB = 30_522
# On a GPU: the paper's widths, batch 16 and BERT's vocabulary, at the two lengths and both
# blocks; 512 -> 256 first, the size of resources.fuse's target.
GPU_SIZES = tuple(
    Size(
        f"{block} {n}->{n // 2} d256 a512",
        {
            "data.input_len": n,
            "model.latent_len": n // 2,
            "model.block": block,
            "model.d_model": 256,
            "model.d_attn": 512,
            "train.batch_size": 16,
        },
        BERT_VOCAB,
    )
    for n in (512, 64)
    for block in ("paper", "transformer")
)
GPU_PACKS = (1, 2, 4, 8, 16)
ROUNDS = 5  # timed rounds per measurement, after one warm-up round
FRACTIONAL_WARMUP, FRACTIONAL_STEPS = 2, 10  # each fractional process's untimed and timed steps
REPEATS = 3  # measurements of each way, alternated; the fastest of each way's is its figure
WAYS = ("one_after_another", "fractional", "fused")


@dataclass(frozen=True)
class Row:
    size: str
    device: str
    precision: str
    K: int
    one_after_another_tokens_per_s: float
    fractional_tokens_per_s: float
    fused_tokens_per_s: float
    fused_vs_fractional: float
    fused_vs_one_after_another: float
    fused_peak_share: float | None  # of the GPU's dense bf16 peak, summed over the pack
    fractional_peak_share: float | None
    peak_gib_one_after_another: float | None
    peak_gib_fractional: float | None
    peak_gib_fused: float | None


def _in_process(
    way: str, config: Config, k: int, vocab: int, tokens: torch.Tensor, device: torch.device
) -> tuple[float, float | None]:
    """Seconds a round (each of the k members one step) and, on a GPU, the peak GiB, of the pack or
    of the k trials one after another, in this process."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    step: Callable[[], None]
    if way == "fused":
        models = [member_model(config, vocab, member, device) for member in range(k)]
        pack = Pack(
            models,
            lr=[1e-4] * k,
            weight_decay=[0.01] * k,
            schedule=[Schedule(1.0, 0, linear=False)] * k,
            plan=plan_head("auto", device),
            autocast=autocast_for(device),
            pad_id=0,
            device=device,
        )
        pack.train()
        del models  # the pack holds its own stacked copies

        def step() -> None:
            pack(tokens)
    else:
        steps = [trial_step(config, vocab, member, device) for member in range(k)]

        def step() -> None:
            for member, train_step in enumerate(steps):
                train_step(tokens[member])

    seconds = median_seconds(step, device, warmup=1, rounds=ROUNDS)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return seconds, peak


def _fractional(processes: Processes, size: Size, k: int) -> tuple[float, float | None]:
    """Seconds a round of the k trials as k processes at once (their span over the steps each took)."""
    threads = max(1, torch.get_num_threads() // k)
    seconds, peak = processes.train(
        [Job(size.settings, size.vocab, member, threads, FRACTIONAL_WARMUP, FRACTIONAL_STEPS) for member in range(k)]
    )
    return seconds / FRACTIONAL_STEPS, peak


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def run(
    sizes: tuple[Size, ...] | None = None,
    packs: tuple[int, ...] | None = None,
    on_row: Callable[[dict[str, Cell]], None] = lambda row: None,
) -> list[dict[str, Cell]]:
    """The table's rows, each handed to ``on_row`` as it is measured. ``sizes`` and ``packs``
    default to the device's (module docstring)."""
    device = device_here()
    gpu = device.type == "cuda"
    sizes = sizes or (GPU_SIZES if gpu else SIZES)
    packs = packs or (GPU_PACKS if gpu else PACKS)
    rows: list[dict[str, Cell]] = []
    with Processes(max(packs)) as processes:
        for size in sizes:
            config = from_flat(size.settings)
            b, t = config.train.batch_size, config.data.input_len
            for k in packs:
                tokens = torch.stack([member_batch(b, t, size.vocab, member, device) for member in range(k)])
                seconds: dict[str, list[float]] = {way: [] for way in WAYS}
                peaks: dict[str, float | None] = {}
                for _ in range(REPEATS):
                    for way in WAYS:
                        took, peaks[way] = (
                            _fractional(processes, size, k)
                            if way == "fractional"
                            else _in_process(way, config, k, size.vocab, tokens, device)
                        )
                        seconds[way].append(took)
                rate = {way: k * b * t / min(seconds[way]) for way in WAYS}
                shares = {way: mfu(config, size.vocab, rate[way]) for way in ("fused", "fractional")}
                row = asdict(
                    Row(
                        size=size.name,
                        device=torch.cuda.get_device_name(0) if gpu else "cpu",
                        precision="bf16" if gpu else "fp32",
                        K=k,
                        **{f"{way}_tokens_per_s": round(rate[way]) for way in WAYS},  # type: ignore[arg-type]
                        fused_vs_fractional=round(rate["fused"] / rate["fractional"], 2),
                        fused_vs_one_after_another=round(rate["fused"] / rate["one_after_another"], 2),
                        fused_peak_share=_rounded(shares["fused"], 4),
                        fractional_peak_share=_rounded(shares["fractional"], 4),
                        **{f"peak_gib_{way}": _rounded(peaks[way], 3) for way in WAYS},  # type: ignore[arg-type]
                    )
                )
                on_row(row)
                rows.append(row)
    return rows


if __name__ == "__main__":  # the GPU check's way in (benchmarks/gpu_check.sh): its table, without the CLI's imports
    from benchmarks.step_check import format_table, machine

    print("bench fuse:", machine(), flush=True)
    # Each row as it is measured, so that a run cut short by the check's timeout still says what it measured.
    table = run(on_row=lambda row: print("bench fuse:", json.dumps(row), flush=True))
    print("\n" + format_table(table), flush=True)
