"""Where a run trains and in what precision: the device it picks, and ``train.precision`` resolved
on it (bf16 autocast or full fp32), with the reason a person reads."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from seqae_core.config import Config


def pick_device(device: str | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def set_up(dev: torch.device) -> None:
    """Set ``dev`` up to train: on CUDA, fp32 runs' matmuls on the tensor cores (bf16 runs: no change)."""
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def native_bf16_flags() -> list[str]:
    """The CPU's bf16 instruction sets (``avx512_bf16``, ``amx_bf16``) as Linux lists them;
    empty where there are none or /proc/cpuinfo cannot be read (then bf16 would be emulated)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in ("avx512_bf16", "amx_bf16") if flag in flags]


def autocast_dtype(config: Config, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``train.precision`` on ``device``: under ``auto``, bf16 on CUDA and
    on CPUs with native bf16 instructions (faster there at the same accuracy, as measured in
    docs/explanation/performance.md), else fp32; bf16 anywhere under ``bf16``; None (full fp32) otherwise."""
    precision = config.train.precision
    if precision == "bf16" or (precision == "auto" and (device.type == "cuda" or native_bf16_flags())):
        return torch.bfloat16
    return None


def describe_precision(config: Config, device: torch.device) -> str:
    """What ``train.precision`` resolves to on ``device``, and why, for the user to read."""
    if autocast_dtype(config, device) is None:
        reason = "" if config.train.precision == "fp32" else " (this CPU has no native bf16)"
        return f"fp32{reason}"
    if config.train.precision == "bf16":
        return "bf16 autocast"
    why = "CUDA" if device.type == "cuda" else f"this CPU has {'/'.join(native_bf16_flags())}"
    return f"bf16 autocast ({why})"


def autocast(config: Config, device: torch.device) -> AbstractContextManager[object]:
    dtype = autocast_dtype(config, device)
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)
