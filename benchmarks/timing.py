"""Timing one call of a step the way a GPU allows: CUDA events around it (the host queues the
kernels ahead of the device, so its clock would time the queueing), the host's clock elsewhere."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def median_seconds(step: Callable[[], None], device: torch.device, warmup: int, rounds: int) -> float:
    """The median seconds of ``rounds`` calls of ``step``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(rounds):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            began = time.perf_counter()
            step()
            times.append(time.perf_counter() - began)
    return sorted(times)[len(times) // 2]
