"""A model's scores on a split's samples, and its reconstructions of the first validation samples."""

from __future__ import annotations

import numpy as np
import torch

from seqae_core import data as data_lib
from seqae_core import metrics as M
from seqae_core.config import Config
from seqae_core.device import autocast
from seqae_core.loss import HeadPlan, Tally, plan_head, score, targets_of
from seqae_core.model import ReducingAutoencoder

SAMPLES = 8  # validation samples shown beside their reconstructions


def batch_scores(
    model: ReducingAutoencoder, tokens: torch.Tensor, pad_id: int, plan: HeadPlan | None = None
) -> tuple[torch.Tensor, Tally]:
    """Mean loss over the non-pad tokens of a (b, t) batch, and its scores on the device.

    Pad positions are never scored: their targets are IGNORE (see ``seqae_core.loss`` for the
    head's ways and their cost). ``plan``: the head's, else the one ``train.head=auto`` picks."""
    plan = plan or plan_head("auto", tokens.device)
    hidden = model.decode(model.encode(tokens))  # (b, t, d)
    return score(hidden, model.head, targets_of(tokens, pad_id), plan.scoring)


@torch.no_grad()
def evaluate(
    model: ReducingAutoencoder,
    splits: data_lib.Splits,
    rows: np.ndarray,
    config: Config,
    device: torch.device,
    plan: HeadPlan | None = None,
) -> M.Scores:
    """The model's scores on ``rows`` of the samples (a split's: ``splits.val``, ``splits.test``),
    summed on the device and read once. ``plan``: the head's, else ``train.head``'s on ``device``."""
    plan = plan or plan_head(config.train.head, device)
    model.eval()
    total = Tally.zeros(device)
    size = config.train.batch_size * 4
    for i in range(0, len(rows), size):
        tokens = splits.batch(rows[i : i + size]).to(device, non_blocking=True)
        with autocast(config, device):
            _, tally = batch_scores(model, tokens, splits.pad_id, plan)
        total.add_(tally)
    return total.read()


def named(scores: M.Scores, names: tuple[str, ...]) -> dict[str, float]:
    """``scores`` as ``{loss, token accuracy, sequence accuracy}`` under ``names``, in that order."""
    return dict(zip(names, (scores.loss, scores.token_accuracy, scores.sequence_accuracy)))


@torch.no_grad()
def reconstruct(
    model: ReducingAutoencoder, splits: data_lib.Splits, device: torch.device
) -> list[dict[str, list[str]]]:
    """The first validation samples beside their reconstructions, as token strings."""
    model.eval()
    tokens = splits.batch(splits.val[:SAMPLES]).to(device)
    predicted = model(tokens).argmax(dim=-1)  # (b, t)
    vocab = splits.vocab()
    samples = []
    for original, output in zip(tokens.tolist(), predicted.tolist()):
        length = len(data_lib.decode(vocab, original, splits.pad_id))
        samples.append(
            {"original": [vocab[i] for i in original[:length]], "reconstruction": [vocab[i] for i in output[:length]]}
        )
    return samples
