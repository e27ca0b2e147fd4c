"""The tabular replay (benchmarks/replay.py) on small synthetic tables whose answers are known."""

from __future__ import annotations

import random
import statistics

from benchmarks.replay import METHODS, Curve, replay

GRID, RANDOM, TPE, ASHA_RANDOM, ASHA_TPE = METHODS


def table(epochs: int = 3) -> list[Curve]:
    """12 configurations whose accuracy rises each epoch, ranked the same at every epoch: only
    lr 3e-3 at width 64 reaches 0.9, at its last epoch."""
    curves = []
    for i, lr in enumerate((1e-4, 3e-4, 1e-3, 3e-3)):
        for j, width in enumerate((16, 32, 64)):
            final = 0.5 + 0.1 * i + 0.04 * j if (i, j) != (3, 2) else 0.9
            curves.append(Curve({"train.lr": lr, "model.d_model": width},
                                tuple(final - 0.1 * (epochs - e) for e in range(1, epochs + 1)),
                                tuple(final - 0.01 for _ in range(epochs)), (1.0,) * epochs))
    return curves


def test_a_grid_on_one_worker_pays_every_epoch_of_the_configurations_before_the_best():
    curves = table()
    for seed in range(5):
        order = list(curves)
        random.Random(seed).shuffle(order)
        position = next(i for i, c in enumerate(order) if c.val[-1] == 0.9)
        result = replay(curves, GRID, seed, 0.9, trials=12, workers=1)
        assert result.cpu_seconds == 3.0 * (position + 1) and result.epochs == 3 * (position + 1)
    assert replay(curves, GRID, 0, 0.95, trials=12, workers=1).cpu_seconds is None  # out of reach: never


def test_two_workers_count_the_other_epoch_in_progress():
    """Two workers, epochs of 1 s: when the target's epoch ends, the other worker has run as long."""
    result = replay(table(), GRID, 0, 0.9, trials=12, workers=2)
    assert result.cpu_seconds is not None and result.cpu_seconds == 2 * (result.epochs // 2 + result.epochs % 2)


def test_asha_reaches_the_target_for_less_where_the_first_rung_ranks_as_the_end_does():
    """The ranking at epoch 1 is the final one, so ASHA stops weak trials early and never pays more
    than the same sampler without it: the random sampler of a seed proposes the same trials with
    ASHA or without (20 seeds)."""
    curves = table(epochs=4)
    costs = {m.name: [replay(curves, m, seed, 0.9, trials=48, grace_period=1, reduction_factor=2).cpu_seconds
                      for seed in range(20)] for m in (RANDOM, ASHA_RANDOM)}
    assert all(c is not None for c in costs["random"] + costs["asha+random"])
    assert all(a <= r for a, r in zip(costs["asha+random"], costs["random"]))
    assert statistics.median(costs["asha+random"]) < 0.75 * statistics.median(costs["random"])
