"""train.repeats' seeds trained as one batched model (seqae_core.fused): each seed's metrics,
curves and checkpoint as when the seeds train one after another."""

from __future__ import annotations

import pytest
import torch

from seqae_core import metrics as M
from seqae_core.config import from_flat
from seqae_core.fused import Pack, fuses
from seqae_core.train import NonFiniteLossError, train
from seqae_errors import ConfigError
from tests.conftest import TINY
from tests.interrupted import train_until

TIMING = {M.TOKENS_PER_S, M.EPOCH_SECONDS, M.EPOCH_CPU_SECONDS, M.VALIDATION_CPU_SECONDS, M.DATA_SECONDS}
SEEDS = 3
EXACT = {"train.repeats": SEEDS, "train.seed": 7, "train.precision": "fp32", "model.dropout": 0.0, "train.epochs": 3,
         "train.log_every_steps": 3}  # fp32 without dropout: the promise of equality; a few curve points an epoch


@pytest.fixture
def tiny_config(tiny_config):
    """test_train's three pages: the tests here train each run several times."""
    return lambda **overrides: tiny_config(**{"data.max_pages": 3, **EXACT, **overrides})


@pytest.fixture
def pack_steps(monkeypatch):
    """Counts the pack's optimizer steps, so that a test knows the fused path trained."""
    steps = {"count": 0}
    real = Pack.__call__

    def counted(self, tokens):
        assert tokens.shape[0] == self.k
        steps["count"] += 1
        return real(self, tokens)

    monkeypatch.setattr(Pack, "__call__", counted)
    return steps


_UNINTERRUPTED: dict[str, list[dict]] = {}


def uninterrupted(config, data_cache) -> list[dict]:
    """The metrics of ``config``'s run, trained once for the tests that compare against it."""
    key = repr(config)
    if key not in _UNINTERRUPTED:
        history: list[dict] = []
        train(config, lambda m, c: history.append(m), cache_dir=data_cache)
        _UNINTERRUPTED[key] = history
    return _UNINTERRUPTED[key]


def assert_histories_match(fused, alone, atol=1e-5):
    """Every metric of every epoch within ``atol`` (the timings aside), the loss curves point by point."""
    assert len(fused) == len(alone) > 0
    for mine, theirs in zip(fused, alone):
        compared = set(mine) - TIMING
        assert compared == set(theirs) - TIMING
        assert len([k for k in compared if M.is_spread(k)]) == 3 * (SEEDS + 1)  # each val metric: its seeds and stderr
        for key in sorted(compared):
            if key == M.TRAIN_LOSS_STEPS:
                assert [s for s, _ in mine[key]] == [s for s, _ in theirs[key]] and mine[key]
                torch.testing.assert_close([v for _, v in mine[key]], [v for _, v in theirs[key]], atol=atol, rtol=0)
            else:
                assert mine[key] == pytest.approx(theirs[key], abs=atol), key


@pytest.mark.parametrize("model", [
    pytest.param({}, id="transformer-tied-head"),
    pytest.param({"model.block": "paper", "model.heads": 1, "model.residual": True, "model.tie_embeddings": False,
                  "model.latent_dim": 8, "model.pos_encoding": "sinusoidal"}, id="paper-own-head-narrow-latent"),
])
def test_fused_repeats_match_each_seed_trained_alone(tiny_config, data_cache, pack_steps, model):
    """fp32, no dropout: the pack of 3 seeds reports every metric of every epoch, each seed's
    among them, within 1e-5 of the seeds trained one after another; so are the checkpoints' weights."""
    runs = {}
    for fuse in ("off", "on"):
        reports = []
        train(tiny_config(**{"train.fuse_repeats": fuse, "train.epochs": 2, **model}),
              lambda m, c, r=reports: r.append((m, c)), cache_dir=data_cache)
        runs[fuse] = reports
        if fuse == "off":
            assert pack_steps["count"] == 0
    assert pack_steps["count"] == runs["on"][-1][0][M.GLOBAL_STEP] > 0  # every step of the fused run was the pack's
    assert_histories_match([m for m, _ in runs["on"]], [m for m, _ in runs["off"]])
    # The last epoch's checkpoints (an earlier one's tensors are the live ones, trained on since).
    fused, alone = runs["on"][-1][1], runs["off"][-1][1]
    assert len(fused.seeds) == len(alone.seeds) == SEEDS
    for mine, theirs in zip(fused.seeds, alone.seeds):
        assert mine["model"].keys() == theirs["model"].keys()
        torch.testing.assert_close(mine["model"], theirs["model"], atol=1e-5, rtol=0)
        assert mine["scheduler"] == theirs["scheduler"]
        assert mine["optimizer"]["param_groups"] == theirs["optimizer"]["param_groups"]
        torch.testing.assert_close(mine["optimizer"]["state"], theirs["optimizer"]["state"], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("before, after", [("on", "off"), ("off", "on")], ids=["fused-then-alone", "alone-then-fused"])
def test_a_run_resumes_fused_or_not_from_either_checkpoint(tiny_config, data_cache, tmp_path, pack_steps, before,
                                                           after):
    """One epoch one way, checkpointed, then two more the other way: the last two epochs' metrics
    are those of an uninterrupted run (within 1e-5)."""
    full = uninterrupted(tiny_config(**{"train.fuse_repeats": "off"}), data_cache)

    state, _ = train_until(tiny_config(**{"train.fuse_repeats": before}), tmp_path / "ckpt", lambda m: m[M.EPOCH] == 1,
                           data_cache)
    fused_before = pack_steps["count"]
    assert (fused_before > 0) == (before == "on")
    assert state.epoch == 1 and len(state.seeds) == SEEDS
    resumed = []
    train(tiny_config(**{"train.fuse_repeats": after}), lambda m, c: resumed.append(m),
          resume=state, cache_dir=data_cache)
    assert (pack_steps["count"] > fused_before) == (after == "on")
    assert [m[M.EPOCH] for m in resumed] == [2, 3]
    assert_histories_match(resumed, full[1:])


def test_a_diverging_member_is_named_by_its_seed(tiny_config, data_cache):
    with pytest.raises(NonFiniteLossError, match=r"at epoch 1, step [0-9]+ seed (7|8|9)"):
        train(tiny_config(**{"train.lr": 1e30, "train.lr_schedule": "constant", "train.fuse_repeats": "on"}),
              cache_dir=data_cache)


def test_fused_dropout_trains_each_member_on_masks_of_its_own(tiny_config, data_cache):
    """With dropout the members draw masks of their own: two members of the same seed's weights
    would otherwise stay equal. (The masks are other draws than the unfused run's: see the docs.)"""
    config = tiny_config(**{"model.dropout": 0.1, "train.epochs": 1, "train.fuse_repeats": "on"})
    final = train(config, cache_dir=data_cache)
    values = [final[M.seed_key(seed, M.VAL_LOSS)] for seed in (7, 8, 9)]
    assert len(set(values)) == SEEDS and all(v == v for v in values)


@pytest.mark.gpu
def test_a_cuda_run_fuses_its_repeats_by_default(tiny_config, data_cache, pack_steps):
    """The GPU twin: train.fuse_repeats=auto packs on CUDA, and the pack learns as the seeds alone
    do (TF32 matmuls there: close, not within 1e-5)."""
    runs = {}
    for fuse in ("off", "auto"):
        reports: list[dict] = []
        train(tiny_config(**{"train.fuse_repeats": fuse, "train.epochs": 2}), lambda m, c: reports.append(m),
              cache_dir=data_cache, device="cuda")
        runs[fuse] = reports
    assert pack_steps["count"] == runs["auto"][-1][M.GLOBAL_STEP]
    for fused, alone in zip(runs["auto"], runs["off"]):
        assert fused[M.VAL_LOSS] == pytest.approx(alone[M.VAL_LOSS], rel=1e-2)


def test_fuse_repeats_auto_fuses_on_cuda_and_not_on_a_cpu():
    def config(**overrides):
        return from_flat({**TINY, "train.repeats": 4, **overrides})

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not fuses(config(), cpu) and fuses(config(), cuda)
    assert fuses(config(**{"train.fuse_repeats": "on"}), cpu)
    assert not fuses(config(**{"train.fuse_repeats": "off"}), cuda)
    assert not fuses(config(**{"train.repeats": 1}), cuda)  # one seed: nothing to fuse, unless asked
    assert not fuses(config(**{"train.compile": "on"}), cuda)


@pytest.mark.parametrize("overrides, message", [
    pytest.param({"train.fuse_repeats": "sometimes"},
                 "train.fuse_repeats='sometimes' must be one of 'auto', 'on', 'off'", id="not-a-choice"),
    pytest.param({"train.fuse_repeats": True}, "train.fuse_repeats=True must be one of", id="a-boolean"),
    pytest.param({"train.fuse_repeats": "on", "train.compile": "on"},
                 "train.fuse_repeats=on cannot be used with train.compile=on", id="with-compile"),
])
def test_a_bad_fuse_repeats_is_refused_in_one_line_naming_key_and_value(overrides, message):
    with pytest.raises(ConfigError) as refused:
        from_flat({**TINY, **overrides}, "--set")
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_bench_fuse_measures_both_ways_side_by_side():
    """`seqae bench fuse`'s measurement at the tests' size, K=2 (the CLI's run is in the docs)."""
    from benchmarks import fuse as bench

    (row,) = bench.run(sizes=bench.SIZES[:1], packs=(2,))
    assert row["K"] == 2 and row["one_after_another_tokens_per_s"] > 0 and row["fused_tokens_per_s"] > 0
    assert row["fused_vs_one_after_another"] == pytest.approx(
        row["fused_tokens_per_s"] / row["one_after_another_tokens_per_s"], abs=0.01)
    assert (row["peak_gib_fused"] is None) == (not torch.cuda.is_available())
