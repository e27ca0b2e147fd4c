"""The vocabulary head's cross-entropy, fused and chunked, and the scores built on it.

With the BERT vocabulary (v = 30,522) the head dominates a training step: for 64 -> 32 tokens
at batch 16 its logits are a (1024, 30522) matrix, 125 MB in fp32. Plain PyTorch writes that
matrix, then reads and writes it again for log-softmax, its backward, the zero-filled gradient
of NLL, dtype casts and argmax: each a pass through main memory. :func:`linear_cross_entropy`
computes the same loss and the same gradients one chunk of rows at a time, so each chunk's
logits stay in cache and are used for loss, argmax and gradient before the next chunk. A GPU
wants few large chunks instead: each chunk is about ten kernel launches and one add of the whole
(v, d) head gradient.
"""

from __future__ import annotations

from typing import Any

import torch

from seqae_core.metrics import Scores

CHUNK_ROWS = 128  # rows of logits per chunk on a CPU: 128 x 30522 fp32 is 15.6 MB
# On a GPU: an H200 trained 512 -> 256 tokens in bf16 at 2.16x (paper block) and 1.97x (transformer
# block) the tokens/s of 128-row chunks with 8192 (1.93x and 1.70x with 1024); 8192 x 30522 fp32 is 1 GB.
GPU_CHUNK_ROWS = 8192


def _compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


class _LinearCrossEntropy(torch.autograd.Function):
    """sum_i CE(hidden_i W^T + b, target_i) and argmax_i; gradients are computed in forward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor,
        dtype: torch.dtype, with_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]  # hidden (n, d), weight (v, d), bias (v,), targets (n,)
        h, w, b = hidden.to(dtype), weight.to(dtype), bias.to(dtype)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        predicted = torch.empty(n, dtype=torch.long, device=hidden.device)
        if with_grad:
            grad_h = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=hidden.device)
            grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=hidden.device)
        chunk = CHUNK_ROWS if hidden.device.type == "cpu" else GPU_CHUNK_ROWS
        for start in range(0, n, chunk):
            rows = slice(start, min(start + chunk, n))
            t = targets[rows]  # (c,)
            logits = torch.addmm(b, h[rows], w.t()).float()  # (c, v)
            target_logit = logits.gather(1, t[:, None]).squeeze(1)  # (c,)
            top, predicted[rows] = logits.max(dim=1)  # (c,), (c,)
            # exp(x - max) below e^-80 would be a denormal float, which x86 computes very slowly;
            # clamping there changes the sums by less than 1e-34 relative.
            probs = logits.sub_(top[:, None]).clamp_(min=-80.0).exp_()  # (c, v), unnormalized, in place
            total = probs.sum(dim=1)  # (c,)
            loss += (total.log() + top - target_logit).sum()
            if with_grad:
                probs.div_(total[:, None])  # softmax
                probs[torch.arange(len(t), device=t.device), t] -= 1.0  # d loss / d logits
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
        return grad_h * grad_loss, grad_w * grad_loss, grad_b * grad_loss, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of cross-entropy, argmax)`` of ``head(hidden)`` against ``targets``.

    hidden: (n, d), targets: (n,) -> loss (), predicted (n,). Equal to
    ``F.cross_entropy(head(hidden), targets, reduction="sum")`` and its gradients, without ever
    holding the (n, v) logits. Honors autocast: the matmuls run in its dtype, the softmax in fp32.
    """
    assert head.bias is not None, "the vocabulary head has a bias"
    dtype = _compute_dtype(hidden.device, head.weight.dtype)
    with_grad = torch.is_grad_enabled() and (hidden.requires_grad or head.weight.requires_grad)
    return _LinearCrossEntropy.apply(hidden, head.weight, head.bias, targets, dtype, with_grad)


def score(hidden: torch.Tensor, head: torch.nn.Linear, tokens: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, Scores]:
    """Mean cross-entropy over the scored tokens, and the batch's scores.

    hidden: (n, d) at the positions where ``keep`` (b, t) is true; tokens: (b, t). Pad positions
    are never scored; a sequence is exact when all its non-pad tokens are right."""
    targets = tokens[keep]  # (n,)
    loss_sum, predicted = linear_cross_entropy(hidden, head, targets)
    right = predicted == targets  # (n,)
    per_position = torch.ones_like(keep)  # (b, t); pads count as right for exact match
    per_position[keep] = right
    scores = Scores(
        loss_sum=float(loss_sum.detach()),
        tokens=targets.numel(),
        correct=int(right.sum()),
        sequences=keep.shape[0],
        exact=int(per_position.all(dim=1).sum()),
    )
    return loss_sum / max(targets.numel(), 1), scores
