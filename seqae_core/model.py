"""The reducing-attention autoencoder of Biermann et al., "Harnessing Attention Mechanisms:
Efficient Sequence Reduction using Attention-based Autoencoders".

Reducing scaled dot-product attention takes its queries from a trainable scaling matrix
``W_S`` of shape (n_out, n_in): ``Q = W_S (X W_Q)``, ``K = X W_K``, ``V = X W_V``, and
``softmax(Q K^T / sqrt(d)) V`` has n_out tokens. The encoder shortens ``input_len`` tokens to
``latent_len``; a decoder of the same kind expands them back; a vocabulary head reconstructs
the input tokens.

Two block kinds (``model.block``):
  paper        the paper's attention alone: single head, no residual, no FFN. Options, off by
               default: ``model.residual`` adds ``W_S X`` (the same ``W_S``) to the attention's
               output, ``model.norm`` a LayerNorm before it, ``model.heads`` several heads.
  transformer  pre-LayerNorm multi-head reducing attention plus a residual path resampled by
               ``W_S``, then a pre-LayerNorm FFN with its own residual.

Both blocks end in an output projection ``W_O`` (d_attn -> d_model) so that blocks stack.

Shape letters used in comments:
  b batch   t tokens in   s tokens out   d d_model   a d_attn   h heads   e a // h   v vocab
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from seqae_core.config import Config


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
    """Fused ``softmax(q k^T / sqrt(e)) v``.  q: (b, h, s, e), k and v: (b, h, t, e) -> (b, h, s, e)."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)


def resample(w_s: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``W_S x`` along the token axis.  w_s: (s, t), x: (b, t, d) -> (b, s, d)."""
    return torch.einsum("st,btd->bsd", w_s, x)


def init_scaling(n_out: int, n_in: int, kind: str = "interpolate") -> torch.Tensor:
    """``W_S`` starts as linear interpolation between the two lengths, so that output token i
    first looks at the input tokens around position ``i * n_in / n_out``; training reshapes it.
    ``random`` draws it from N(0, 1/n_in) instead (an ablation)."""
    if kind == "random":
        return torch.randn(n_out, n_in) / math.sqrt(n_in)
    positions = (torch.arange(n_out, dtype=torch.float64) + 0.5) * n_in / n_out - 0.5  # (s,)
    distance = (positions[:, None] - torch.arange(n_in, dtype=torch.float64)[None, :]).abs()  # (s, t)
    width = max(1.0, n_in / n_out)
    weights = (1.0 - distance / width).clamp(min=0.0)
    return (weights / weights.sum(dim=1, keepdim=True)).float()


class ReducingAttention(nn.Module):
    """Multi-head reducing attention: ``n_in`` tokens in, ``n_out`` tokens out."""

    def __init__(
        self,
        n_in: int,
        n_out: int,
        d_model: int,
        d_attn: int,
        heads: int,
        dropout: float,
        w_s_init: str = "interpolate",
    ) -> None:
        super().__init__()
        assert d_attn % heads == 0, "checked by the config"
        self.heads, self.dropout = heads, dropout
        self.w_s = nn.Parameter(init_scaling(n_out, n_in, w_s_init))  # (s, t)
        self.w_q = nn.Linear(d_model, d_attn, bias=False)
        self.w_k = nn.Linear(d_model, d_attn, bias=False)
        self.w_v = nn.Linear(d_model, d_attn, bias=False)
        self.w_o = nn.Linear(d_attn, d_model, bias=False)

    def forward(self, x: torch.Tensor, x_s: torch.Tensor | None = None) -> torch.Tensor:
        """x: (b, t, d) -> (b, s, d). ``x_s = W_S x`` may be passed in when the caller has it.

        ``Q = W_S (X W_Q)`` is computed as ``(W_S X) W_Q``: the same product, cheaper when d < a."""
        b, t, _ = x.shape
        if x_s is None:
            x_s = resample(self.w_s, x)  # (b, s, d)
        s, h = x_s.shape[1], self.heads
        q = self.w_q(x_s).view(b, s, h, -1).transpose(1, 2)  # (b, h, s, e)
        k = self.w_k(x).view(b, t, h, -1).transpose(1, 2)  # (b, h, t, e)
        v = self.w_v(x).view(b, t, h, -1).transpose(1, 2)  # (b, h, t, e)
        y = attention(q, k, v, self.dropout if self.training else 0.0)  # (b, h, s, e)
        return self.w_o(y.transpose(1, 2).reshape(b, s, -1))  # (b, s, d)


class PaperBlock(nn.Module):
    """The paper's reducing attention (``model.heads`` heads, 1 in the paper), optionally after a
    LayerNorm and with a residual path resampled by the same ``W_S``; no FFN."""

    def __init__(self, n_in: int, n_out: int, config: Config) -> None:
        super().__init__()
        m = config.model
        self.attn = ReducingAttention(n_in, n_out, m.d_model, m.d_attn, m.heads, m.dropout, m.w_s_init)
        self.norm = nn.LayerNorm(m.d_model) if m.norm else None
        self.residual = m.residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, t, d) -> (b, s, d)
        if self.norm is not None:
            y = self.attn(self.norm(x))
            return y + resample(self.attn.w_s, x) if self.residual else y
        x_s = resample(self.attn.w_s, x)  # (b, s, d): the queries' input, and the residual
        y = self.attn(x, x_s)
        return y + x_s if self.residual else y


class TransformerBlock(nn.Module):
    """Pre-LayerNorm reducing attention with a ``W_S``-resampled residual, then an FFN."""

    def __init__(self, n_in: int, n_out: int, config: Config) -> None:
        super().__init__()
        m = config.model
        self.norm_attn = nn.LayerNorm(m.d_model)
        self.attn = ReducingAttention(n_in, n_out, m.d_model, m.d_attn, m.heads, m.dropout, m.w_s_init)
        self.norm_ffn = nn.LayerNorm(m.d_model)
        self.ffn = nn.Sequential(
            nn.Linear(m.d_model, m.d_ffn), nn.GELU(), nn.Linear(m.d_ffn, m.d_model), nn.Dropout(m.dropout)
        )
        self.drop = nn.Dropout(m.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, t, d) -> (b, s, d)
        d = x.shape[-1]
        normed = self.norm_attn(x)
        # One product resamples both the residual and the normed queries' input.
        both = resample(self.attn.w_s, torch.cat([x, normed], dim=-1))  # (b, s, 2d)
        residual, normed_s = both[..., :d], both[..., d:]
        y = residual + self.drop(self.attn(normed, normed_s))  # (b, s, d)
        return y + self.ffn(self.norm_ffn(y))


class PositionalEncoding(nn.Module):
    """Adds learned, sinusoidal or no position vectors to a (b, n, d) sequence."""

    def __init__(self, kind: str, n: int, d: int) -> None:
        super().__init__()
        self.kind = kind
        if kind == "learned":
            self.table = nn.Parameter(torch.randn(n, d) * 0.02)  # (n, d)
        elif kind == "sinusoidal":
            position = torch.arange(n, dtype=torch.float32)[:, None]  # (n, 1)
            freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))  # (d/2,)
            table = torch.zeros(n, d)
            table[:, 0::2] = torch.sin(position * freq)
            table[:, 1::2] = torch.cos(position * freq)[:, : d // 2]
            self.register_buffer("table", table, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.kind == "none" else x + self.table


def length_schedule(input_len: int, latent_len: int, layers: int, reduction: str) -> list[int]:
    """Token counts between encoder blocks: ``[input_len, ..., latent_len]`` (layers + 1 entries).

    >>> length_schedule(64, 16, 3, "gradual")
    [64, 48, 32, 16]
    """
    if reduction == "once":
        return [input_len] + [latent_len] * layers
    return [round(input_len + (latent_len - input_len) * i / layers) for i in range(layers + 1)]


class ReducingAutoencoder(nn.Module):
    """tokens (b, t) -> latent (b, s, w) -> hidden (b, t, d) -> logits (b, t, v), where the latent
    width w is ``model.latent_dim`` (a linear projection of the encoder's output and one back before
    the decoder) or, without it, d."""

    def __init__(self, config: Config, vocab_size: int) -> None:
        super().__init__()
        m, t, s = config.model, config.data.input_len, config.latent_len
        block = {"paper": PaperBlock, "transformer": TransformerBlock}[m.block]
        self.lengths = length_schedule(t, s, m.layers, m.reduction)
        ups = self.lengths[::-1]
        self.embed = nn.Embedding(vocab_size, m.d_model)
        self.pos_in = PositionalEncoding(m.pos_encoding, t, m.d_model)
        self.pos_latent = PositionalEncoding(m.pos_encoding, s, m.d_model)
        self.encoder = nn.ModuleList(block(a, b, config) for a, b in zip(self.lengths, self.lengths[1:]))
        self.decoder = nn.ModuleList(block(a, b, config) for a, b in zip(ups, ups[1:]))
        self.norm = nn.LayerNorm(m.d_model) if m.block == "transformer" else nn.Identity()
        self.head = nn.Linear(m.d_model, vocab_size)
        if m.tie_embeddings:
            self.head.weight = self.embed.weight  # (v, d), one tensor for both
        self.drop = nn.Dropout(m.dropout)
        self.narrow = nn.Identity() if m.latent_dim is None else nn.Linear(m.d_model, m.latent_dim)
        self.widen = nn.Identity() if m.latent_dim is None else nn.Linear(m.latent_dim, m.d_model)

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (b, t) -> latent (b, s, w)."""
        x = self.drop(self.pos_in(self.embed(tokens)))  # (b, t, d)
        for block in self.encoder:
            x = block(x)  # (b, t_i, d) -> (b, t_{i+1}, d)
        return self.narrow(x)

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """latent (b, s, w) -> hidden (b, t, d), before the vocabulary head."""
        x = self.pos_latent(self.widen(latent))
        for block in self.decoder:
            x = block(x)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (b, t) -> logits (b, t, v)."""
        return self.head(self.decode(self.encode(tokens)))
