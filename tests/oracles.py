"""Plain-PyTorch twins of seqae's fused paths: the oracles the tests compare them against."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The plain formula, the oracle of the fused path."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (b, h, s, t)
    return scores.softmax(dim=-1) @ v  # (b, h, s, e)


def reference_cross_entropy(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor):
    """The plain-PyTorch twin of linear_cross_entropy: the oracle of its values and gradients."""
    logits = head(hidden).float()  # (n, v)
    return F.cross_entropy(logits, targets, reduction="sum"), logits.argmax(dim=-1)
