"""A training step's matmul FLOPs, and the share of a GPU's bf16 peak they reach."""

from __future__ import annotations

import torch

from seqae_core.config import Config
from seqae_core.model import length_schedule


def forward_flops(config: Config, vocab_size: int) -> tuple[float, float]:
    """Matmul FLOPs of one sample's forward pass: (vocabulary head, everything else)."""
    t, s, d, a, f = (
        config.data.input_len,
        config.latent_len,
        config.model.d_model,
        config.model.d_attn,
        config.model.d_ffn,
    )
    head = 2 * t * d * vocab_size
    lengths = length_schedule(t, s, config.model.layers, config.model.reduction)
    body = 0
    for n_in, n_out in list(zip(lengths, lengths[1:])) + list(zip(lengths[::-1], lengths[::-1][1:])):
        # W_S x, Q, K and V, scores, weighted values, W_O
        body += 2 * (n_out * n_in * d + n_out * d * a + 2 * n_in * d * a + 2 * n_out * n_in * a + n_out * a * d)
        if config.model.block == "transformer":
            body += 2 * n_out * n_in * d + 4 * n_out * d * f  # the resampled residual, the FFN
    return float(head), float(body)


def head_share(config: Config, vocab_size: int) -> float:
    """Fraction of a training step's matmul FLOPs spent in the vocabulary head."""
    head, body = forward_flops(config, vocab_size)
    return head / (head + body)


PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 FLOP/s


def mfu(config: Config, vocab_size: int, tokens_per_s: float) -> float | None:
    """Model FLOPs utilization on this GPU (forward + backward = 3x forward), if its peak is known."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    if peak is None:
        return None
    head, body = forward_flops(config, vocab_size)
    return 3 * (head + body) * tokens_per_s / config.data.input_len / peak
