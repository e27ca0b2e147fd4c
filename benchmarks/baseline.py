"""The plain PyTorch loop seqae's step is measured against: the paper's math written straight.

``Q = W_S (X W_Q)`` in that order, the attention as an explicit softmax, the full (b, t, v)
logits into ``F.cross_entropy(ignore_index=pad)``. It holds the seqae model's parameters, so both
start from the same values; only the computation differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from seqae_core.config import Config
from seqae_core.model import ReducingAutoencoder


class BaselineAutoencoder(nn.Module):
    """The same math as ``ReducingAutoencoder``, written plainly over the same parameters."""

    def __init__(self, config: Config, vocab_size: int) -> None:
        super().__init__()
        self.block = config.model.block
        self.model = ReducingAutoencoder(config, vocab_size)  # used only as a container of parameters

    def attention(self, attn: Any, x: torch.Tensor, x_kv: torch.Tensor) -> torch.Tensor:
        b, t, _ = x_kv.shape
        h = attn.heads
        q = attn.w_s @ (x @ attn.w_q.weight.T)  # (b, s, a): W_S (X W_Q), literally
        k = x_kv @ attn.w_k.weight.T
        v = x_kv @ attn.w_v.weight.T
        s = q.shape[1]
        q, k, v = (m.reshape(b, -1, h, m.shape[-1] // h).transpose(1, 2) for m in (q, k, v))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return (weights @ v).transpose(1, 2).reshape(b, s, -1) @ attn.w_o.weight.T

    def run_block(self, block: Any, x: torch.Tensor) -> torch.Tensor:
        if self.block == "paper":
            return self.attention(block.attn, x, x)
        normed = block.norm_attn(x)
        y = block.attn.w_s @ x + self.attention(block.attn, normed, normed)
        return y + block.ffn(block.norm_ffn(y))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = m.pos_in(m.embed(tokens))
        for block in m.encoder:
            x = self.run_block(block, x)
        x = m.pos_latent(x)
        for block in m.decoder:
            x = self.run_block(block, x)
        return m.head(m.norm(x))  # (b, t, v)


def plain_step(
    model: BaselineAutoencoder,
    optimizer: torch.optim.Optimizer,
    pad_id: int,
    vocab_size: int,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> Callable[[torch.Tensor], None]:
    """The plain loop's training step: the full (b, t, v) logits into ``F.cross_entropy``."""

    def step(tokens: torch.Tensor) -> None:
        with autocast():
            logits = model(tokens)
        loss = F.cross_entropy(logits.float().view(-1, vocab_size), tokens.view(-1), ignore_index=pad_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step
