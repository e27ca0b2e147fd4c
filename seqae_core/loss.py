"""The vocabulary head's cross-entropy, three ways, and the scores built on it, kept on the device.

With the BERT vocabulary (v = 30,522) the head dominates a training step: for 64 -> 32 tokens
at batch 16 its logits are a (1024, 30522) matrix, 125 MB in fp32. Each way computes the same
summed loss and gradients over every position of a batch, pads included but weighted 0, so a
batch's shapes never depend on its contents and nothing waits for the device to say how many
tokens were real (no boolean indexing, no ``.item()``):

- ``chunked``: :class:`_ChunkedCrossEntropy`, the logits one block of rows at a time, each used
  for loss, argmax and gradient before the next, so they stay in cache. A CPU wants small blocks
  (they fit its cache), a GPU few large ones (each block is a dozen launches).
- ``dense``: the logits written once in the matmul's dtype and PyTorch's cross-entropy on them:
  what ``torch.compile`` fuses best.
- ``fused``: Liger-Kernel's Triton linear + cross-entropy (the ``gpu`` extra), which never writes
  the logits; CUDA only. It reads one scalar back to the host per call (its token count).

Which one a run uses is :func:`plan_head`'s choice from ``train.head`` and the device, made once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from seqae_core.metrics import Scores
from seqae_errors import ConfigError

try:  # the gpu extra: Liger-Kernel's Triton kernels
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
except ImportError:
    liger_fused_linear_cross_entropy = None

IGNORE = -100  # the target of a position that is not scored (padding): PyTorch's and Liger's ignore_index
CPU_CHUNK_ROWS = 128  # 128 x 30522 fp32 is 15.6 MB: a block of logits that stays in a CPU's cache
GPU_CHUNK_ROWS = 8192  # few blocks on a GPU (docs/explanation/performance.md has the measured rows)
HeadKind = Literal["chunked", "dense", "fused"]


@dataclass(frozen=True)
class HeadPlan:
    """How the vocabulary head's loss is computed: ``kind``, and for ``chunked`` the rows a block."""

    kind: HeadKind
    chunk_rows: int

    @property
    def scoring(self) -> HeadPlan:
        """The plan for scoring without gradients (validation, test): it needs each position's
        argmax, which the fused kernel does not return, so a fused run scores chunked."""
        return HeadPlan("chunked", self.chunk_rows) if self.kind == "fused" else self


def liger_available() -> bool:
    return liger_fused_linear_cross_entropy is not None


def plan_head(name: str, device: torch.device) -> HeadPlan:
    """The head for ``train.head`` = ``name`` on ``device``: under ``auto``, chunked on a CPU,
    fused on a GPU where Liger-Kernel is installed, else dense. Asking for ``fused`` where it
    cannot run is a ConfigError naming what is missing."""
    chunk_rows = CPU_CHUNK_ROWS if device.type == "cpu" else GPU_CHUNK_ROWS
    if name == "auto":
        if device.type == "cpu":
            return HeadPlan("chunked", chunk_rows)
        return HeadPlan("fused" if device.type == "cuda" and liger_available() else "dense", chunk_rows)
    if name == "fused":
        if device.type != "cuda":
            raise ConfigError(
                f"train.head=fused runs on CUDA only (this run's device is {device.type}): "
                "use train.head=auto, chunked or dense"
            )
        if not liger_available():
            raise ConfigError('train.head=fused needs Liger-Kernel: pip install -e ".[gpu]" (or train.head=dense)')
    return HeadPlan(name, chunk_rows)  # type: ignore[arg-type]


def _compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


class _ChunkedCrossEntropy(torch.autograd.Function):
    """sum_i w_i CE(hidden_i W^T + b, target_i) and argmax_i, w_i = 0 where target_i is IGNORE;
    the gradients are computed in forward, a block of rows at a time. Without ``predict`` the
    argmax is not taken (an empty tensor is returned): a row's maximum without its index is a
    cheaper reduction on a CPU."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        targets: torch.Tensor,
        dtype: torch.dtype,
        with_grad: bool,
        chunk_rows: int,
        predict: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]  # hidden (n, d), weight (v, d), bias (v,), targets (n,)
        h, w, b = hidden.to(dtype), weight.to(dtype), bias.to(dtype)
        scored = (targets != IGNORE).to(torch.float32)  # (n,) 1 where a position counts, 0 at pads
        safe = targets.clamp(min=0)  # (n,) a valid index everywhere; the pads' terms are weighted 0
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        predicted = torch.empty(n if predict else 0, dtype=torch.long, device=hidden.device)
        if with_grad:
            grad_h = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=hidden.device)
            grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=hidden.device)
        on_cpu = hidden.device.type == "cpu"
        for start in range(0, n, chunk_rows):
            rows = slice(start, min(start + chunk_rows, n))
            t, weight_rows = safe[rows], scored[rows]  # (c,), (c,)
            logits = torch.addmm(b, h[rows], w.t()).float()  # (c, v)
            target_logit = logits.gather(1, t[:, None]).squeeze(1)  # (c,)
            if predict:
                top, predicted[rows] = logits.max(dim=1)  # (c,), (c,)
            else:
                top = logits.amax(dim=1)  # (c,)
            probs = logits.sub_(top[:, None])
            if on_cpu:
                # exp(x - max) below e^-80 would be a denormal float, which x86 computes very
                # slowly; clamping there changes the sums by less than 1e-34 relative.
                probs.clamp_(min=-80.0)
            probs = probs.exp_()  # (c, v), unnormalized, in place
            total = probs.sum(dim=1)  # (c,)
            loss += ((total.log() + top - target_logit) * weight_rows).sum()
            if with_grad:
                probs.mul_((weight_rows / total)[:, None])  # softmax, weighted: a pad's row is all 0
                probs[torch.arange(len(t), device=t.device), t] -= weight_rows  # d loss / d logits
                g = probs.to(dtype)
                grad_h[rows] = g @ w  # (c, d)
                grad_w += (g.t() @ h[rows]).float()  # (v, d)
                grad_b += probs.sum(dim=0)
        if with_grad:
            ctx.save_for_backward(grad_h.to(hidden.dtype), grad_w.to(weight.dtype), grad_b.to(bias.dtype))
        ctx.mark_non_differentiable(predicted)
        return loss, predicted

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _: Any) -> tuple[Any, ...]:  # type: ignore[override]
        grad_h, grad_w, grad_b = ctx.saved_tensors
        return grad_h * grad_loss, grad_w * grad_loss, grad_b * grad_loss, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    targets: torch.Tensor,
    plan: HeadPlan,
    *,
    predict: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(sum of cross-entropy, argmax)`` of ``head(hidden)`` against ``targets``, as ``plan`` says.

    hidden: (n, d), targets: (n,) with IGNORE where a position is not scored -> loss (), fp32;
    predicted (n,), or None where ``predict`` is False (a training step reads only the loss).
    Equal to ``F.cross_entropy(head(hidden), targets, ignore_index=IGNORE, reduction="sum")`` and its
    gradients. Honors autocast: the matmuls run in its dtype, the softmax in fp32."""
    assert head.bias is not None, "the vocabulary head has a bias"
    return head_cross_entropy(hidden, head.weight, head.bias, targets, plan, predict=predict)


def head_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    targets: torch.Tensor,
    plan: HeadPlan,
    *,
    predict: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`linear_cross_entropy` of a head given as its weight (v, d) and bias (v,): one member's
    slice of stacked heads (``seqae_core.fused``) as well as a module's own."""
    dtype = _compute_dtype(hidden.device, weight.dtype)
    if plan.kind == "chunked":
        with_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
        loss, predicted = _ChunkedCrossEntropy.apply(
            hidden, weight, bias, targets, dtype, with_grad, plan.chunk_rows, predict
        )
        return loss, predicted if predict else None
    if plan.kind == "dense":
        logits = F.linear(hidden.to(dtype), weight.to(dtype), bias.to(dtype))  # (n, v)
        loss = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE, reduction="sum")
        return loss, logits.argmax(dim=-1) if predict else None
    assert not predict, "the fused head returns no argmax: score with plan.scoring"
    assert liger_fused_linear_cross_entropy is not None, "plan_head plans fused only where Liger-Kernel is installed"
    loss = liger_fused_linear_cross_entropy(
        hidden.to(dtype), weight.to(dtype), targets, bias.to(dtype), ignore_index=IGNORE, reduction="sum"
    )
    return loss.float(), None


@dataclass
class Tally:
    """Scores summed on the device, batch after batch, read back to the host once by :meth:`read`."""

    loss_sum: torch.Tensor  # () fp32
    tokens: torch.Tensor  # () int64: the scored (non-pad) tokens
    correct: torch.Tensor  # () int64
    sequences: torch.Tensor  # () int64: rows with at least one scored token
    exact: torch.Tensor  # () int64: rows whose every scored token is right

    @classmethod
    def zeros(cls, device: torch.device) -> Tally:
        zero = torch.zeros((), dtype=torch.int64, device=device)
        return cls(
            torch.zeros((), dtype=torch.float32, device=device), zero.clone(), zero.clone(), zero.clone(), zero.clone()
        )

    def add_(self, other: Tally) -> None:
        for name in ("loss_sum", "tokens", "correct", "sequences", "exact"):
            getattr(self, name).add_(getattr(other, name))

    def read(self) -> Scores:
        """The host's copy: one transfer, the only point where the host waits for the device."""
        loss_sum = float(self.loss_sum)
        tokens, correct, sequences, exact = torch.stack(
            [self.tokens, self.correct, self.sequences, self.exact]
        ).tolist()
        return Scores(loss_sum=loss_sum, tokens=tokens, correct=correct, sequences=sequences, exact=exact)


def targets_of(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """tokens (b, t) -> targets (b, t): each token, IGNORE at the pads."""
    return tokens.masked_fill(tokens == pad_id, IGNORE)


def score(
    hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, plan: HeadPlan
) -> tuple[torch.Tensor, Tally]:
    """Mean cross-entropy over the scored tokens of a batch, and its scores, on the device.

    hidden: (b, t, d); targets: (b, t) from :func:`targets_of`. Pad positions are never scored; a
    sequence is exact when all its scored tokens are right; a row with none is not a sequence."""
    b, t, d = hidden.shape
    loss_sum, predicted = linear_cross_entropy(hidden.reshape(b * t, d), head, targets.reshape(b * t), plan)
    assert predicted is not None
    scored = targets != IGNORE  # (b, t)
    right = (predicted.view(b, t) == targets) & scored  # (b, t)
    real = scored.any(dim=1)  # (b,)
    tally = Tally(
        loss_sum=loss_sum.detach(),
        tokens=scored.sum(),
        correct=right.sum(),
        sequences=real.sum(),
        exact=((right | ~scored).all(dim=1) & real).sum(),
    )
    return loss_sum / tally.tokens.clamp(min=1), tally
