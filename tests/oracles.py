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
    """The plain-PyTorch twin of linear_cross_entropy: the oracle of its values and gradients
    (targets of -100 are not scored)."""
    logits = head(hidden).float()  # (n, v)
    return F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum"), logits.argmax(dim=-1)


def reference_training(config, splits, epochs: int) -> list[dict[str, float]]:
    """The trainer as it was before the sync-free step, written plainly: pads indexed out of each
    batch, the plain cross-entropy on the rows left, the same seed, data order, optimizer and
    schedule as ``seqae_core.train``. Each epoch's validation loss and token accuracy."""
    from seqae_core.model import ReducingAutoencoder
    from seqae_core.schedule import lr_factor

    torch.manual_seed(config.train.seed)
    model = ReducingAutoencoder(config, splits.vocab_size)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay, fused=True
    )
    steps_per_epoch = math.ceil(len(splits.train) / config.train.batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_factor(config.train, steps_per_epoch, config.data.input_len)
    )
    history = []
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(
            len(splits.train), generator=torch.Generator().manual_seed(config.train.seed * 100_003 + epoch)
        ).numpy()
        for i in range(0, len(order), config.train.batch_size):
            tokens = splits.batch(splits.train[order[i : i + config.train.batch_size]])
            keep = tokens != splits.pad_id
            loss = F.cross_entropy(model(tokens)[keep], tokens[keep])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
        model.eval()
        with torch.no_grad():
            tokens = splits.batch(splits.val)
            keep = tokens != splits.pad_id
            logits = model(tokens)[keep]
            history.append(
                {
                    "val_loss": float(F.cross_entropy(logits, tokens[keep])),
                    "val_token_accuracy": float((logits.argmax(-1) == tokens[keep]).float().mean()),
                }
            )
    return history
