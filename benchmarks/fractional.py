"""One trial's training step, and K such trials trained at once in K processes that share one device,
as Ray Tune runs K trials of ``resources.gpu: 1/K``: Ray gives each trial its own process and only
accounts the fraction; the processes' kernels time-slice the GPU (no MPS), each with its own CUDA
context, allocator and launches. Ray itself is not needed for that and is not on the GPU machine
(``benchmarks/gpu_check.sh``), so the processes here are plain ones. On a CPU each process gets
``cores // K`` threads (at least one), as a trial of ``resources.cpu`` = cores / K would.

``seqae bench fuse`` (:mod:`benchmarks.fuse`) trains the same trials this way, one after another
(:func:`trial_step` in its own process), and fused.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.rows import Settings
from seqae_core.config import Config, from_flat
from seqae_core.loss import plan_head
from seqae_core.model import ReducingAutoencoder
from seqae_core.step import TrainStep

READY_SECONDS = (
    600.0  # the longest a process may take to start, or a member to build and warm up (a Triton compile included)
)


def device_here() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast_for(device: torch.device) -> Callable[[], Any]:
    """bf16 on a GPU (``train.precision=auto``'s there), fp32 on a CPU (its exact path)."""
    return lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def member_batch(batch: int, length: int, vocab: int, member: int, device: torch.device) -> torch.Tensor:
    """Member ``member``'s (b, t) token batch, some windows ending early in padding (id 0)."""
    generator = torch.Generator().manual_seed(member)
    tokens = torch.randint(1, vocab, (batch, length), generator=generator)
    ends = torch.randint(length // 4, length + 1, (batch,), generator=generator)
    tokens[torch.arange(length)[None, :] >= ends[:, None]] = 0
    return tokens.to(device)


def member_model(config: Config, vocab: int, member: int, device: torch.device) -> ReducingAutoencoder:
    torch.manual_seed(member)
    with device:  # built where it trains: K paper-width models built on a host would take seconds each
        return ReducingAutoencoder(config, vocab)


def trial_step(config: Config, vocab: int, member: int, device: torch.device) -> Callable[[torch.Tensor], None]:
    """One trial's step as a run alone trains it: its model, ``AdamW(fused=True)``, schedule and head."""
    model = member_model(config, vocab, member, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    return TrainStep(
        model,
        optimizer,
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
        plan=plan_head("auto", device),
        autocast=autocast_for(device),
        pad_id=0,
        device=device,
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Job:
    """Train member ``member`` of a size: ``warmup`` untimed steps, then, from the start time the
    driver sends, ``steps`` timed ones."""

    settings: Settings
    vocab: int
    member: int
    threads: int
    warmup: int
    steps: int


@dataclass(frozen=True)
class Done:
    seconds: float  # from the common start to this member's last step done
    peak_gib: float | None  # this process's peak allocated GPU memory (None on a CPU)


def _next(inbox: Any) -> Any:
    """The driver's next message; ``None`` once the driver is gone, however it went (the GPU
    check's timeout kills it with no time to close its processes)."""
    driver = multiprocessing.parent_process()
    while True:
        try:
            return inbox.get(timeout=1.0)
        except queue.Empty:
            if driver is not None and not driver.is_alive():
                return None


def _serve(inbox: Any, outbox: Any) -> None:
    """A worker process: a job at a time until ``None``."""
    device = device_here()
    torch.zeros((), device=device)  # the CUDA context made before the driver times anything
    outbox.put("up")
    while (job := _next(inbox)) is not None:
        torch.set_num_threads(job.threads)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        config = from_flat(job.settings)
        step = trial_step(config, job.vocab, job.member, device)
        tokens = member_batch(config.train.batch_size, config.data.input_len, job.vocab, job.member, device)
        for _ in range(job.warmup):
            step(tokens)
        synchronize(device)
        outbox.put("ready")
        if (start := _next(inbox)) is None:
            return
        time.sleep(max(0.0, start - time.perf_counter()))  # perf_counter: one monotonic clock, all processes
        for _ in range(job.steps):
            step(tokens)
        synchronize(device)
        outbox.put(
            Done(
                time.perf_counter() - start,
                torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            )
        )
        del step, tokens


class Processes:
    """``n`` worker processes, started once (each imports PyTorch and, on a GPU, makes its CUDA
    context), that train up to ``n`` trials at a time."""

    def __init__(self, n: int) -> None:
        context = multiprocessing.get_context("spawn")  # a CUDA parent cannot fork
        self._inboxes = [context.Queue() for _ in range(n)]
        self._outboxes = [context.Queue() for _ in range(n)]
        self._workers = [
            context.Process(target=_serve, args=(i, o), daemon=True) for i, o in zip(self._inboxes, self._outboxes)
        ]
        for worker in self._workers:
            worker.start()
        for index in range(n):  # started, before anything is timed: n importing PyTorch would slow it
            assert self._answer(index) == "up"

    def _answer(self, index: int) -> Any:
        try:
            return self._outboxes[index].get(timeout=READY_SECONDS)
        except queue.Empty:
            alive = self._workers[index].is_alive()
            raise RuntimeError(
                f"bench fuse: fractional member {index} gave no answer in {READY_SECONDS:.0f} s"
                f" (its process {'still runs' if alive else 'died'})"
            ) from None

    def train(self, jobs: list[Job]) -> tuple[float, float | None]:
        """Each job in its own process at once: (seconds from their common start until the last
        finished, the processes' peak GPU memory summed, or None on a CPU)."""
        assert len(jobs) <= len(self._workers), "more trials than processes"
        for inbox, job in zip(self._inboxes, jobs):
            inbox.put(job)
        for index in range(len(jobs)):
            assert self._answer(index) == "ready"
        start = time.perf_counter() + 0.05  # every worker waiting on its inbox gets the time before it
        for inbox in self._inboxes[: len(jobs)]:
            inbox.put(start)
        done: list[Done] = [self._answer(index) for index in range(len(jobs))]
        peaks = [d.peak_gib for d in done]
        return max(d.seconds for d in done), None if None in peaks else sum(p for p in peaks if p is not None)

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)
        for worker in self._workers:
            worker.join(timeout=30)
            if worker.is_alive():  # still in a job: an error left it training
                worker.terminate()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
