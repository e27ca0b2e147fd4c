"""train.repeats' seeds trained as one batched model (seqae_core.fused): each seed's metrics,
curves and checkpoint as when the seeds train one after another; and a sweep's trials of one shape
as one pack (seqae_core.members), each member's records and checkpoints as when it trains alone."""

from __future__ import annotations

import re

import pytest
import torch

from seqae_core import metrics as M
from seqae_core.checkpoint import Checkpoint, tensor_bytes, tensors
from seqae_core.config import from_flat, fusion_key
from seqae_core.fused import MEASURED_FASTER, Pack, fuses
from seqae_core.loops import NonFiniteLossError
from seqae_core.members import train_members
from seqae_core.train import train
from seqae_errors import ConfigError
from tests.conftest import TINY
from tests.interrupted import Stop, train_until

TIMING = {M.TOKENS_PER_S, M.EPOCH_SECONDS, M.EPOCH_CPU_SECONDS, M.VALIDATION_CPU_SECONDS, M.DATA_SECONDS}
SEEDS = 3
# A checkpoint's weights: a coordinate whose gradient is a sum that nearly cancels keeps the rounding
# of the pack's other summation order, and Adam's normalized step carries that into the weight, past
# 1e-5 in some runs (docs/explanation/performance.md, "Repeats side by side"); the metrics, averages
# over every token, stay within 1e-5.
WEIGHTS_ATOL = 1e-4
EXACT = {
    "train.repeats": SEEDS,
    "train.seed": 7,
    "train.precision": "fp32",
    "model.dropout": 0.0,
    "train.epochs": 3,
    "train.log_every_steps": 3,
}  # fp32 without dropout: the promise of equality; a few curve points an epoch


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
        train(config, lambda m, c: history.append(m.as_dict()), cache_dir=data_cache)
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


@pytest.mark.parametrize(
    "model",
    [
        pytest.param({}, id="transformer-tied-head"),
        pytest.param(
            {
                "model.block": "paper",
                "model.heads": 1,
                "model.residual": True,
                "model.tie_embeddings": False,
                "model.latent_dim": 8,
                "model.pos_encoding": "sinusoidal",
            },
            id="paper-own-head-narrow-latent",
        ),
    ],
)
def test_fused_repeats_match_each_seed_trained_alone(tiny_config, data_cache, pack_steps, model):
    """fp32, no dropout: the pack of 3 seeds reports every metric of every epoch, each seed's
    among them, within 1e-5 of the seeds trained one after another; the checkpoints' weights within
    ``WEIGHTS_ATOL``."""
    runs = {}
    for fuse in ("off", "on"):
        reports = []
        train(
            tiny_config(**{"train.fuse_repeats": fuse, "train.epochs": 2, **model}),
            lambda m, c, r=reports: r.append((m.as_dict(), c)),
            cache_dir=data_cache,
        )
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
        torch.testing.assert_close(mine["model"], theirs["model"], atol=WEIGHTS_ATOL, rtol=0)
        assert mine["scheduler"] == theirs["scheduler"]
        assert mine["optimizer"]["param_groups"] == theirs["optimizer"]["param_groups"]
        torch.testing.assert_close(mine["optimizer"]["state"], theirs["optimizer"]["state"], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("before, after", [("on", "off"), ("off", "on")], ids=["fused-then-alone", "alone-then-fused"])
def test_a_run_resumes_fused_or_not_from_either_checkpoint(
    tiny_config, data_cache, tmp_path, pack_steps, before, after
):
    """One epoch one way, checkpointed, then two more the other way: the last two epochs' metrics
    are those of an uninterrupted run (within 1e-5)."""
    full = uninterrupted(tiny_config(**{"train.fuse_repeats": "off"}), data_cache)

    state, _ = train_until(
        tiny_config(**{"train.fuse_repeats": before}), tmp_path / "ckpt", lambda m: m.epoch == 1, data_cache
    )
    fused_before = pack_steps["count"]
    assert (fused_before > 0) == (before == "on")
    assert state.epoch == 1 and len(state.seeds) == SEEDS
    resumed = []
    train(
        tiny_config(**{"train.fuse_repeats": after}),
        lambda m, c: resumed.append(m.as_dict()),
        resume=state,
        cache_dir=data_cache,
    )
    assert (pack_steps["count"] > fused_before) == (after == "on")
    assert [m[M.EPOCH] for m in resumed] == [2, 3]
    assert_histories_match(resumed, full[1:])


def test_a_diverging_member_is_named_by_its_seed(tiny_config, data_cache):
    with pytest.raises(NonFiniteLossError, match=r"at epoch 1, step [0-9]+ seed (7|8|9)"):
        train(
            tiny_config(**{"train.lr": 1e30, "train.lr_schedule": "constant", "train.fuse_repeats": "on"}),
            cache_dir=data_cache,
        )


def test_fused_dropout_trains_each_member_on_masks_of_its_own(tiny_config, data_cache):
    """With dropout the members draw masks of their own: two members of the same seed's weights
    would otherwise stay equal. (The masks are other draws than the unfused run's: see the docs.)"""
    config = tiny_config(**{"model.dropout": 0.1, "train.epochs": 1, "train.fuse_repeats": "on"})
    final = train(config, cache_dir=data_cache)
    values = [final[M.seed_key(seed, M.VAL_LOSS)] for seed in (7, 8, 9)]
    assert len(set(values)) == SEEDS and all(v == v for v in values)


@pytest.mark.gpu
def test_a_cuda_run_packs_its_repeats_when_asked(tiny_config, data_cache, pack_steps):
    """The GPU twin: train.fuse_repeats=on packs on CUDA, and the pack learns as the seeds alone
    do (TF32 matmuls there: close, not within 1e-5)."""
    runs = {}
    for fuse in ("off", "on"):
        reports: list[dict] = []
        train(
            tiny_config(**{"train.fuse_repeats": fuse, "train.epochs": 2}),
            lambda m, c, reports=reports: reports.append(m.as_dict()),
            cache_dir=data_cache,
            device="cuda",
        )
        runs[fuse] = reports
    assert pack_steps["count"] == runs["on"][-1][M.GLOBAL_STEP]
    for fused, alone in zip(runs["on"], runs["off"]):
        assert fused[M.VAL_LOSS] == pytest.approx(alone[M.VAL_LOSS], rel=1e-2)


def test_fuse_repeats_auto_fuses_only_where_measured_faster(monkeypatch):
    """auto packs no device's seeds until seqae bench fuse measures a pack faster there (none yet:
    a CPU measured slower, a GPU not yet measured); a device added to MEASURED_FASTER packs."""

    def config(**overrides):
        return from_flat({**TINY, "train.repeats": 4, **overrides})

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert MEASURED_FASTER == frozenset()
    assert not fuses(config(), cpu) and not fuses(config(), cuda)
    assert fuses(config(**{"train.fuse_repeats": "on"}), cpu) and fuses(config(**{"train.fuse_repeats": "on"}), cuda)
    monkeypatch.setattr("seqae_core.fused.MEASURED_FASTER", frozenset({"cuda"}))
    assert fuses(config(), cuda) and not fuses(config(), cpu)
    assert not fuses(config(**{"train.fuse_repeats": "off"}), cuda)
    assert not fuses(config(**{"train.repeats": 1}), cuda)  # one seed: nothing to fuse, unless asked
    assert not fuses(config(**{"train.compile": "on"}), cuda)


@pytest.mark.parametrize(
    "overrides, message",
    [
        pytest.param(
            {"train.fuse_repeats": "sometimes"},
            "train.fuse_repeats='sometimes' must be one of 'auto', 'on', 'off'",
            id="not-a-choice",
        ),
        pytest.param({"train.fuse_repeats": True}, "train.fuse_repeats=True must be one of", id="a-boolean"),
        pytest.param(
            {"train.fuse_repeats": "on", "train.compile": "on"},
            "train.fuse_repeats=on cannot be used with train.compile=on",
            id="with-compile",
        ),
    ],
)
def test_a_bad_fuse_repeats_is_refused_in_one_line_naming_key_and_value(overrides, message):
    with pytest.raises(ConfigError) as refused:
        from_flat({**TINY, **overrides}, "--set")
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_bench_fuse_measures_the_three_ways_side_by_side():
    """`seqae bench fuse`'s measurement at the tests' size, K=2: fused, as two processes at once
    (fractional), and one after another (the CLI's run is in the docs)."""
    from benchmarks import fuse as bench

    rows = []
    assert bench.run(sizes=bench.SIZES[:1], packs=(2,), on_row=rows.append) == rows
    (row,) = rows
    assert row["K"] == 2 and all(row[f"{way}_tokens_per_s"] > 0 for way in bench.WAYS)
    assert row["fused_vs_fractional"] == pytest.approx(
        row["fused_tokens_per_s"] / row["fractional_tokens_per_s"], abs=0.01
    )
    assert row["fused_vs_one_after_another"] == pytest.approx(
        row["fused_tokens_per_s"] / row["one_after_another_tokens_per_s"], abs=0.01
    )
    on_gpu = torch.cuda.is_available()
    assert all((row[f"peak_gib_{way}"] is None) == (not on_gpu) for way in bench.WAYS)
    assert (row["fused_peak_share"] is None) == (not on_gpu)


def test_the_packs_adamw_steps_each_member_bit_for_bit_as_its_own_adamw():
    """Given the same gradients, member i's weights and moments after each step equal those of its
    own ``AdamW(fused=True)`` under its ``LambdaLR`` exactly: its lr, weight decay and schedule, one
    member's schedule decaying, another's constant."""
    from seqae_core.adamw import StackedAdamW
    from seqae_core.schedule import Schedule

    lrs, decays = [1e-3, 3e-3, 2e-4], [0.01, 0.0, 0.1]
    schedules = [Schedule(0.1, 4, linear=True), Schedule(1.0, 0, linear=False), Schedule(0.5, 2, linear=True)]
    generator = torch.Generator().manual_seed(0)
    shapes = [(5, 3), (7,), (2, 3, 4)]
    alone = [[torch.randn(shape, generator=generator) for shape in shapes] for _ in lrs]
    stacked = [torch.stack([member[j] for member in alone]).requires_grad_() for j in range(len(shapes))]
    pack = StackedAdamW(stacked, lr=lrs, weight_decay=decays, schedule=schedules, device=torch.device("cpu"))
    optimizers = [
        torch.optim.AdamW([p.requires_grad_() for p in member], lr=lr, weight_decay=wd, fused=True)
        for member, lr, wd in zip(alone, lrs, decays)
    ]
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, s) for o, s in zip(optimizers, schedules)]
    for _ in range(6):
        for j, weight in enumerate(stacked):
            weight.grad = torch.randn(weight.shape, generator=generator)
            for i, member in enumerate(alone):
                member[j].grad = weight.grad[i].clone()
        pack.step()
        for optimizer, scheduler in zip(optimizers, schedulers):
            optimizer.step()
            scheduler.step()
        for i, (member, optimizer) in enumerate(zip(alone, optimizers)):
            for j, weight in enumerate(member):
                assert torch.equal(stacked[j][i], weight), (i, j)
                assert torch.equal(pack.exp_avg[j][i], optimizer.state[weight]["exp_avg"]), (i, j)
                assert torch.equal(pack.exp_avg_sq[j][i], optimizer.state[weight]["exp_avg_sq"]), (i, j)


# --- a sweep's trials of one shape as one pack (seqae_core.members) ---

MEMBERS = [  # differing in every free key: each its own lr, schedule, weight decay, batches, patience
    {
        "train.lr": 2e-3,
        "train.lr_final": 1e-4,
        "train.lr_decay_epochs": 2,
        "train.weight_decay": 0.01,
        "train.seed": 7,
        "train.patience": 5,
    },
    {
        "train.lr": 3e-3,
        "train.lr_final": 3e-3,
        "train.lr_decay_epochs": 5,
        "train.weight_decay": 0.0,
        "train.seed": 8,
        "train.patience": 2,
    },
    {
        "train.lr": 1e-6,
        "train.lr_final": 1e-7,
        "train.lr_decay_epochs": 1,
        "train.weight_decay": 0.1,
        "train.seed": 9,
        "train.patience": 1,
    },  # barely learns: out of patience after epoch 2
]


@pytest.fixture
def member_config(tiny_config):
    """A pack member's config: one seed, the free keys of ``MEMBERS[i]``, and ``overrides``."""
    return lambda i, **overrides: tiny_config(**{"train.repeats": 1, **MEMBERS[i], **overrides})


class PackReports:
    """A pack's reports, member by member, and the indices each validation's report drops."""

    def __init__(self, drop: dict[int, set[int]] | None = None) -> None:
        self.calls: list[list] = []
        self.drop = drop or {}

    def __call__(self, results):
        self.calls.append(results)
        return self.drop.get(len(self.calls), set())

    def metrics(self, index: int) -> list[dict]:
        return [r.record.as_dict() for call in self.calls for r in call if r.index == index]

    def last_checkpoint(self, index: int):
        return [r.checkpoint for call in self.calls for r in call if r.index == index][-1]


def assert_member_matches(mine, alone, atol=1e-5):
    """A member's records as its run's alone, the timings and the pack's size aside."""
    assert len(mine) == len(alone) > 0
    for record, theirs in zip(mine, alone):
        assert record.keys() - TIMING - {M.PACK_MEMBERS} == theirs.keys() - TIMING
        for key in sorted(theirs.keys() - TIMING):
            if key == M.TRAIN_LOSS_STEPS:
                assert [s for s, _ in record[key]] == [s for s, _ in theirs[key]] and record[key]
                torch.testing.assert_close([v for _, v in record[key]], [v for _, v in theirs[key]], atol=atol, rtol=0)
            else:
                assert record[key] == pytest.approx(theirs[key], abs=atol), key


_ALONE: dict[str, tuple[list[dict], Checkpoint, dict]] = {}


def alone_run(config, data_cache) -> tuple[list[dict], Checkpoint, dict]:
    """``config``'s records trained alone, its last checkpoint and its final metrics (trained once per config)."""
    if repr(config) not in _ALONE:
        reports: list = []
        final = train(config, lambda m, c: reports.append((m.as_dict(), c)), cache_dir=data_cache)
        _ALONE[repr(config)] = [m for m, _ in reports], reports[-1][1], final
    return _ALONE[repr(config)]


def test_members_differing_in_every_free_key_each_train_as_alone(member_config, data_cache, pack_steps):
    """fp32, no dropout: three trials of one shape, each with its own lr, lr_final, decay epochs,
    weight decay, seed and patience, in one pack: every metric of every epoch, and the last
    checkpoint's optimizer and schedule, within 1e-5 of each trained alone, its weights within
    ``WEIGHTS_ATOL``."""
    configs = [member_config(i) for i in range(3)]
    assert len({fusion_key(c) for c in configs}) == 1 and len({repr(c) for c in configs}) == 3
    reports = PackReports()
    finals = train_members(configs, reports, cache_dir=data_cache)
    steps = pack_steps["count"]
    assert steps == reports.calls[0][0].record.global_step * len(reports.calls) > 0  # each epoch's steps, fused
    for i, config in enumerate(configs):
        alone, checkpoint, final = alone_run(config, data_cache)
        assert_member_matches(reports.metrics(i), alone)
        assert finals[i] is not None and finals[i].keys() == final.keys()
        for key in final.keys() - TIMING - {M.TRAIN_SECONDS}:
            assert finals[i][key] == pytest.approx(final[key], abs=1e-5), key
        mine = reports.last_checkpoint(i)
        assert mine.finished and mine.config == checkpoint.config and len(mine.seeds) == 1
        assert mine.patience_spent == checkpoint.patience_spent == (i == 2)
        torch.testing.assert_close(mine.seeds[0]["model"], checkpoint.seeds[0]["model"], atol=WEIGHTS_ATOL, rtol=0)
        assert mine.seeds[0]["scheduler"] == checkpoint.seeds[0]["scheduler"]
        assert mine.seeds[0]["optimizer"]["param_groups"] == checkpoint.seeds[0]["optimizer"]["param_groups"]
        torch.testing.assert_close(
            mine.seeds[0]["optimizer"]["state"], checkpoint.seeds[0]["optimizer"]["state"], atol=1e-5, rtol=1e-4
        )
    # Member 2 left when its patience ran out: the third epoch's pack had two.
    assert [[(r.index, r.record.pack_members) for r in call] for call in reports.calls] == [
        [(0, 3), (1, 3), (2, 3)],
        [(0, 3), (1, 3), (2, 3)],
        [(0, 2), (1, 2)],
    ]
    assert len({r.record.lr for r in reports.calls[0]}) == 3  # each member on its own schedule


def test_a_member_the_report_drops_leaves_with_its_record_of_that_epoch(member_config, data_cache):
    """The report drops member 1 after epoch 1 (a scheduler stopped it): that record is its last
    and its summary's; the pack trains on with two, each still as alone."""
    configs = [member_config(i) for i in range(3)]
    reports = PackReports(drop={1: {1}})
    finals = train_members(configs, reports, cache_dir=data_cache)
    dropped = reports.metrics(1)
    alone = [alone_run(c, data_cache)[0] for c in configs]
    assert [m[M.EPOCH] for m in dropped] == [1]
    assert_member_matches(dropped, alone[1][:1])
    assert finals[1] is not None and finals[1][M.EPOCHS_RUN] == 1 and finals[1][M.STOPPED_EARLY]
    for i in (0, 2):
        assert_member_matches(reports.metrics(i), alone[i])
    assert [[(r.index, r.record.pack_members) for r in call] for call in reports.calls] == [
        [(0, 3), (1, 3), (2, 3)],
        [(0, 2), (2, 2)],
        [(0, 1)],
    ]


def test_a_diverging_member_fails_alone_and_the_others_train_as_alone(member_config, data_cache):
    """Member 1's loss overflows in epoch 1: it leaves then, named in its result, and is returned
    as None; the others' gradients never mixed with its: they match their runs alone."""
    configs = [member_config(0), member_config(1, **{"train.lr": 1e30, "train.lr_final": 1e30}), member_config(2)]
    with pytest.raises(NonFiniteLossError, match=r"at epoch 1, step [0-9]+$"):
        train(configs[1], cache_dir=data_cache)  # alone, it raises
    reports = PackReports()
    finals = train_members(configs, reports, cache_dir=data_cache)
    (failed,) = [r for r in reports.calls[0] if r.index == 1]
    assert failed.record is None and failed.checkpoint is None
    assert re.fullmatch(r"NonFiniteLossError: training loss is not finite at epoch 1, step [0-9]+", failed.error)
    assert all(r.index != 1 for call in reports.calls[1:] for r in call) and finals[1] is None
    assert [r.record.pack_members for r in reports.calls[0] if r.record] == [3, 3]  # it trained the part
    for i in (0, 2):
        assert_member_matches(reports.metrics(i), alone_run(configs[i], data_cache)[0])
        assert finals[i] is not None


def test_when_every_member_fails_the_report_still_gets_their_errors(member_config, data_cache):
    configs = [member_config(i, **{"train.lr": 1e30, "train.lr_final": 1e30}) for i in range(2)]
    reports = PackReports()
    assert train_members(configs, reports, cache_dir=data_cache) == [None, None]
    assert len(reports.calls) == 1 and [r.index for r in reports.calls[0]] == [0, 1]
    assert all(
        r.record is None and r.error.startswith("NonFiniteLossError: training loss is not finite at epoch 1")
        for r in reports.calls[0]
    )


def test_members_resume_from_their_own_checkpoints_in_a_pack_or_alone(member_config, data_cache):
    """Three members checkpointed after epoch 1 (their checkpoints saved and read back, as a
    sweep's store does): two resume as a pack, the third through train(); each ends as its
    uninterrupted run alone."""
    configs = [member_config(i) for i in range(3)]

    def stop_after_one(results):
        saved.extend(Checkpoint.of_state(tensors(tensor_bytes(r.checkpoint.state()))) for r in results)
        raise Stop

    saved: list[Checkpoint] = []
    with pytest.raises(Stop):
        train_members(configs, stop_after_one, cache_dir=data_cache)
    assert [c.epoch for c in saved] == [1, 1, 1] and not any(c.finished for c in saved)
    reports = PackReports()
    train_members(configs[:2], reports, resumes=saved[:2], cache_dir=data_cache)
    alone: list[dict] = []
    train(configs[2], lambda m, c: alone.append(m.as_dict()), resume=saved[2], cache_dir=data_cache)
    for i, resumed in enumerate([reports.metrics(0), reports.metrics(1), alone]):
        full = alone_run(configs[i], data_cache)[0]
        assert [m[M.EPOCH] for m in resumed] == [m[M.EPOCH] for m in full[1:]]
        assert_member_matches(resumed, full[1:])


def test_a_finished_member_is_not_trained_and_returns_its_summary(member_config, data_cache):
    done = member_config(0, **{"train.epochs": 1})
    reports: list = []
    final = train(done, lambda m, c: reports.append(c), cache_dir=data_cache)
    pack = PackReports()
    finals = train_members(
        [done, member_config(1, **{"train.epochs": 1})], pack, resumes=[reports[-1], None], cache_dir=data_cache
    )
    assert [[r.index for r in call] for call in pack.calls] == [[1]]
    assert {k: v for k, v in finals[0].items() if k != M.DATA_SECONDS} == {  # this call's start-up
        k: v for k, v in final.items() if k != M.DATA_SECONDS
    }
    assert finals[1] is not None and finals[1][M.EPOCHS_RUN] == 1


def test_fused_members_draw_dropout_masks_of_their_own(member_config, data_cache):
    """Two members of one seed, differing only in patience: with dropout they would stay equal
    if they shared masks."""
    configs = [member_config(0, **{"model.dropout": 0.1, "train.epochs": 1, "train.patience": p}) for p in (3, 4)]
    finals = train_members(configs, cache_dir=data_cache)
    assert finals[0] is not None and finals[1] is not None
    assert finals[0][M.VAL_LOSS] != finals[1][M.VAL_LOSS]


@pytest.mark.parametrize(
    "overrides, message",
    [
        pytest.param([{}, {"model.d_model": 48}], "the configs differ in model.d_model (32, 48)", id="another-shape"),
        pytest.param([{}, {"train.epochs": 2}], "the configs differ in train.epochs (3, 2)", id="other-epochs"),
        pytest.param([{"train.repeats": 2}, {}], "train.repeats=[2, 1]", id="repeats"),
        pytest.param(
            [{"train.compile": "on", "train.fuse_repeats": "off"}] * 2, "train.compile=['on', 'on']", id="compiled"
        ),
    ],
)
def test_configs_that_cannot_share_a_pack_are_refused_in_one_line(member_config, overrides, message):
    configs = [member_config(i, **o) for i, o in enumerate(overrides)]
    with pytest.raises(ConfigError) as refused:
        train_members(configs)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_members_at_different_places_are_refused(member_config, data_cache, tmp_path):
    state, _ = train_until(member_config(0), tmp_path / "ckpt", lambda m: m.epoch == 1, data_cache)
    with pytest.raises(ConfigError, match=r"different places \(member 0 after epoch 1, member 1 at the start\)"):
        train_members([member_config(0), member_config(1)], resumes=[state, None], cache_dir=data_cache)
