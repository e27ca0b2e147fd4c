"""``seqae bench fuse``: K seeds of one config trained as one pack (:mod:`seqae_core.fused`) against
the same K trained one after another, as ``train.repeats`` = K does with ``train.fuse_repeats``
on and off.

For each size and K in 1, 2, 4, 8: the aggregate training tokens/s of the K members (K batches
of b x t tokens a round, each member its own batch), the median round after a warm-up round,
the two ways alternated three times so that drift in the machine's speed hits both alike (each
way's fastest median counts); and on a GPU the peak memory of each way
(``torch.cuda.max_memory_allocated``; a CPU's is not measured). CUDA events time a GPU's rounds,
``time.perf_counter`` a CPU's. Synthetic batches, with the padding
real windows have, so no data is needed: only the shapes matter to the speed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from benchmarks.timing import median_seconds
from seqae_core.config import Config, from_flat
from seqae_core.fused import Pack
from seqae_core.loss import plan_head
from seqae_core.model import ReducingAutoencoder
from seqae_core.schedule import Schedule
from seqae_core.step import TrainStep


@dataclass(frozen=True)
class Size:
    name: str
    settings: dict[str, Any]  # config keys over the defaults
    vocab: int


SIZES = (
    # The tests' tiny model (tests/conftest.py's TINY), with the corpus vocabulary of its six pages.
    Size("tiny 16->8 (tests)", {"data.input_len": 16, "model.block": "transformer", "model.d_model": 32,
                                "model.d_attn": 32, "model.heads": 2, "model.d_ffn": 64, "train.batch_size": 32}, 3_549),
    # The quickstart's trial (sweeps/studies/quickstart.yaml with its best widths, d_model 128, d_attn 64),
    # what a CPU trains: the transformer block, 64 -> 32, batch 16, and the corpus vocabulary of its
    # 36 pages of the mini Wikipedia (9,269 ids).
    Size("quickstart 64->32 d128 a64", {"data.input_len": 64, "model.latent_len": 32, "model.block": "transformer",
                                        "model.heads": 4, "model.d_ffn": 512, "model.d_model": 128, "model.d_attn": 64,
                                        "train.batch_size": 16}, 9_269),
    # The paper's widths and block at 64 -> 32, batch 16, with a corpus vocabulary (data.vocab=corpus)
    # of 8,192 ids, about the quickstart's: BERT's 30,522 would make a CPU's round of K=8 take half a minute.
    Size("paper 64->32 d256 a512", {"data.input_len": 64, "model.latent_len": 32, "model.d_model": 256,
                                    "model.d_attn": 512, "train.batch_size": 16}, 9_269),
)
PACKS = (1, 2, 4, 8)
ROUNDS = 5  # timed rounds per measurement, after one warm-up round
REPEATS = 3  # measurements of each way, alternated; the fastest of each way's is its figure


@dataclass(frozen=True)
class Row:
    size: str
    device: str
    precision: str
    K: int
    one_after_another_tokens_per_s: float
    fused_tokens_per_s: float
    fused_vs_one_after_another: float
    peak_gib_one_after_another: float | None
    peak_gib_fused: float | None


def _batches(k: int, batch: int, length: int, vocab: int, device: torch.device) -> torch.Tensor:
    """(k, b, t) token batches, some windows ending early in padding (id 0)."""
    generator = torch.Generator().manual_seed(k)
    tokens = torch.randint(1, vocab, (k, batch, length), generator=generator)
    ends = torch.randint(length // 4, length + 1, (k, batch), generator=generator)
    tokens[torch.arange(length)[None, None, :] >= ends[..., None]] = 0
    return tokens.to(device)


def _models(config: Config, k: int, vocab: int, device: torch.device) -> list[ReducingAutoencoder]:
    models = []
    for seed in range(k):
        torch.manual_seed(seed)
        models.append(ReducingAutoencoder(config, vocab).to(device))
    return models


def _measure(way: str, config: Config, k: int, vocab: int, tokens: torch.Tensor, device: torch.device,
             autocast: Callable[[], Any]) -> tuple[float, float | None]:
    """Seconds a round (each of the k members one step) and, on a GPU, the peak GiB, of one way."""
    plan = plan_head("auto", device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    models = _models(config, k, vocab, device)
    step: Callable[[], None]
    if way == "fused":
        pack = Pack(models, lr=[1e-4] * k, weight_decay=[0.01] * k, schedule=[Schedule(1.0, 0, linear=False)] * k,
                    plan=plan, autocast=autocast, pad_id=0, device=device)
        pack.train()

        def step() -> None:
            pack(tokens)
    else:
        steps = []
        for model in models:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
            steps.append(TrainStep(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                                   plan=plan, autocast=autocast, pad_id=0, device=device))

        def step() -> None:
            for member, train_step in enumerate(steps):
                train_step(tokens[member])
    seconds = median_seconds(step, device, warmup=1, rounds=ROUNDS)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return seconds, peak


def run(sizes: tuple[Size, ...] = SIZES, packs: tuple[int, ...] = PACKS) -> list[dict[str, Any]]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = "bf16" if device.type == "cuda" else "fp32"  # train.precision=auto's on a GPU; a CPU's exact path

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    rows = []
    for size in sizes:
        config = from_flat(size.settings)
        b, t = config.train.batch_size, config.data.input_len
        for k in packs:
            tokens = _batches(k, b, t, size.vocab, device)
            seconds: dict[str, list[float]] = {"alone": [], "fused": []}
            peaks: dict[str, float | None] = {}
            for _ in range(REPEATS):
                for way in ("alone", "fused"):
                    took, peaks[way] = _measure(way, config, k, size.vocab, tokens, device, autocast)
                    seconds[way].append(took)
            alone, fused = (k * b * t / min(seconds[way]) for way in ("alone", "fused"))
            rows.append(asdict(Row(
                size=size.name, device=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                precision=precision, K=k, one_after_another_tokens_per_s=round(alone), fused_tokens_per_s=round(fused),
                fused_vs_one_after_another=round(fused / alone, 2),
                peak_gib_one_after_another=None if peaks["alone"] is None else round(peaks["alone"], 3),
                peak_gib_fused=None if peaks["fused"] is None else round(peaks["fused"], 3))))
    return rows


if __name__ == "__main__":  # the GPU check's way in (benchmarks/gpu_check.sh): its table, without the CLI's imports
    from benchmarks.step_check import format_table

    print("\n" + format_table(run()), flush=True)
