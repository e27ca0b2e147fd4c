from __future__ import annotations

import json

import pytest
import torch

from seqae.cli.main import main
from seqae_core import metrics as M
from seqae_core.checkpoint import Checkpoint, CheckpointStore, tensors
from seqae_core.config import TrainConfig
from seqae_core.epoch import EpochRecord
from seqae_core.evaluation import batch_scores
from seqae_core.loops import NonFiniteLossError
from seqae_core.model import ReducingAutoencoder
from seqae_core.schedule import lr_factor
from seqae_core.train import EarlyStopping, train, validation_steps
from seqae_errors import ConfigError
from tests.conftest import TINY, sets
from tests.interrupted import train_until

TIMING = {M.TOKENS_PER_S, M.EPOCH_SECONDS, M.EPOCH_CPU_SECONDS, M.VALIDATION_CPU_SECONDS, M.DATA_SECONDS}


@pytest.fixture
def tiny_config(tiny_config):
    """The tiny config on three pages (282 training windows rather than 1,253): every test here
    trains whole runs, some twice, and what they check does not depend on the data's size."""
    return lambda **overrides: tiny_config(**{"data.max_pages": 3, **overrides})


def without_timing(history):
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


@pytest.mark.parametrize("latent_dim", [None, 16], ids=["full-width", "latent-a-quarter-as-wide"])
def test_overfits_one_batch_at_half_length(tiny_config, data_cache, latent_dim):
    """A transformer-block model memorizes one real batch through a latent half as long (and, with
    model.latent_dim, a quarter as wide as its embedding)."""
    from seqae_core import data

    config = tiny_config(
        **{"model.d_model": 64, "model.d_attn": 64, "model.d_ffn": 128, "model.latent_dim": latent_dim}
    )
    splits = data.load(config.data, data_cache)
    tokens = splits.batch(splits.train[:16])  # (16, 16), real Wikipedia windows
    assert config.latent_len == 8
    torch.manual_seed(0)
    model = ReducingAutoencoder(config, splits.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss, tally = batch_scores(model, tokens, splits.pad_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if tally.read().token_accuracy == 1.0:
            break
    model.eval()
    with torch.no_grad():
        _, tally = batch_scores(model, tokens, splits.pad_id)
    scores = tally.read()
    assert scores.token_accuracy == 1.0
    assert scores.sequence_accuracy == 1.0


def test_reports_every_epoch_and_returns_the_best(tiny_config, data_cache):
    reports, tiny = [], tiny_config(**{"train.epochs": 3})
    final = train(tiny, lambda m, c: reports.append((m.as_dict(), c)), cache_dir=data_cache)
    assert [m[M.EPOCH] for m, _ in reports] == [1, 2, 3]
    assert set(M.PER_EPOCH) <= set(reports[0][0])
    best = max(reports, key=lambda r: r[0][M.VAL_TOKEN_ACCURACY])[0]
    assert final[M.VAL_TOKEN_ACCURACY] == best[M.VAL_TOKEN_ACCURACY]
    assert final[M.BEST_EPOCH] == best[M.EPOCH]
    assert final[M.EPOCHS_RUN] == 3 and final[M.STOPPED_EARLY] is False
    assert final[M.LATENT_FRACTION] == 0.5
    assert (final[M.LATENT_FLOATS], final[M.LATENT_SHARE]) == (tiny.latent_floats, 0.5)  # not narrowed: as the fraction
    assert reports[-1][1].finished is True and reports[0][1].finished is False
    for key in ("model", "optimizer", "scheduler", "early_stopping", "rng", "history", "epoch"):
        assert key in reports[0][1].state()


def test_a_record_is_its_checkpoints_history_and_reads_back_from_it(tiny_config, data_cache):
    """The epoch record (seqae_core.epoch). Two seeds, a test split, two validations an epoch and the
    machine's use: every kind of key a record holds, in the order training has always reported them
    (the checkpoint's history is the serialized form), read back into the same record."""
    config = tiny_config(
        **{
            "train.epochs": 1,
            "train.repeats": 2,
            "data.test_fraction": 0.2,
            "train.validate_every": 0.5,
            "train.log_every_steps": 3,
        }
    )
    reports: list[tuple[EpochRecord, object]] = []
    train(
        config,
        lambda record, checkpoint: reports.append((record, checkpoint)),
        cache_dir=data_cache,
        measure=lambda: {f"{M.SYSTEM_PREFIX}cpu_utilization_percentage": 50.0},
    )
    records, last = [r for r, _ in reports], reports[-1][1]
    assert [r.as_dict() for r in records] == last.history  # type: ignore[attr-defined]
    assert [list(r.as_dict()) for r in records] == [list(h) for h in last.history]  # type: ignore[attr-defined]
    assert [EpochRecord.of_dict(h) for h in last.history] == records  # type: ignore[attr-defined]
    first = records[0].as_dict()
    assert list(first)[:4] == [M.EPOCH, M.VALIDATION, M.TRAIN_LOSS, M.VAL_LOSS]
    assert list(first)[-1] == f"{M.SYSTEM_PREFIX}cpu_utilization_percentage"
    assert M.seed_key(config.train.seed + 1, M.TEST_LOSS) in first and M.COMPILE_SECONDS not in first
    assert [r.epoch for r in records] == [0.5, 1] and [r.validation for r in records] == [1, 2]
    assert records[0].value(M.VAL_TOKEN_ACCURACY) == records[0].val_token_accuracy
    with pytest.raises(KeyError, match="no metric 'val_f1'"):
        records[0].value("val_f1")


def test_the_kept_checkpoint_is_scored_on_the_test_pages(tiny_config, data_cache, tmp_path):
    """Each record carries the test scores of the checkpoint early stopping kept so far; the run's
    final ones are the best model's on the test pages, re-scored here from the stored model."""
    from seqae_core import data
    from seqae_core.evaluation import evaluate

    config = tiny_config(**{"train.epochs": 3, "data.test_fraction": 0.2, "train.lr": 3e-3})
    store, reports = CheckpointStore(str(tmp_path / "ckpt")), []

    def keep(record, checkpoint):
        store.save(record, checkpoint)
        reports.append(record.as_dict())

    final = train(config, keep, cache_dir=data_cache)
    assert set(M.TEST_METRICS) <= set(final) and all(set(M.TEST_METRICS) <= set(m) for m in reports)
    for m in reports:  # the kept checkpoint's: they change only at a new best epoch
        assert m[M.TEST_TOKEN_ACCURACY] == reports[m[M.BEST_EPOCH] - 1][M.TEST_TOKEN_ACCURACY]
    best = store.latest("best")
    assert best.epoch == final[M.BEST_EPOCH]
    saved = tensors(best.files["model.pt"])
    model = ReducingAutoencoder(config, len(saved["token_ids"]))
    model.load_state_dict(saved["model"])
    splits = data.load(config.data, data_cache)
    scores = evaluate(model, splits, splits.test, config, torch.device("cpu"))
    assert final[M.TEST_TOKEN_ACCURACY] == pytest.approx(scores.token_accuracy, abs=1e-6)
    assert final[M.TEST_LOSS] == pytest.approx(scores.loss, rel=1e-5)
    assert M.TEST_TOKEN_ACCURACY not in train(tiny_config(**{"train.epochs": 1}), cache_dir=data_cache)


def test_the_loss_curve_has_a_point_every_n_steps_and_the_epoch_its_mean(tiny_config, data_cache):
    """Every train.log_every_steps steps, the mean loss since the previous point, at its global step:
    at N=1, every step's loss, around the epoch's mean."""
    from seqae_core import data

    settings = {"train.epochs": 2, "train.batch_size": 8}
    config = tiny_config(**settings, **{"train.log_every_steps": 1})
    steps_per_epoch = -(-len(data.load(config.data, data_cache).train) // 8)
    every, sevenths = [], []
    train(config, lambda m, c: every.append(m.as_dict()), cache_dir=data_cache)
    train(
        tiny_config(**settings, **{"train.log_every_steps": 7}),
        lambda m, c: sevenths.append(m.as_dict()),
        cache_dir=data_cache,
    )
    assert steps_per_epoch > 7
    for epoch, (one, seven) in enumerate(zip(every, sevenths), 1):
        first, last = (epoch - 1) * steps_per_epoch + 1, epoch * steps_per_epoch
        assert [s for s, _ in one[M.TRAIN_LOSS_STEPS]] == list(range(first, last + 1))
        assert [s for s, _ in seven[M.TRAIN_LOSS_STEPS]] == [s for s in range(first, last + 1) if s % 7 == 0]
        assert one[M.GLOBAL_STEP] == last
        losses = [loss for _, loss in one[M.TRAIN_LOSS_STEPS]]
        assert min(losses) < one[M.TRAIN_LOSS] < max(losses)
    # a point is the mean of the steps since the previous one: the same training, seen every 7 steps
    by_step = dict(p for m in every for p in m[M.TRAIN_LOSS_STEPS])
    for step, loss in sevenths[0][M.TRAIN_LOSS_STEPS]:
        window = [by_step[s] for s in range(step - 6, step + 1)]
        assert min(window) <= loss <= max(window)


def test_repeats_train_each_seed_as_its_own_run_and_report_their_mean(tiny_config, data_cache):
    """train.repeats=2: each seed's validation scores are exactly those of its run alone (dropout
    on: the seeds draw from streams of their own); the record's scores are their mean, with the
    standard error beside, and the test scores are the seeds' at the epoch the mean kept. (One
    after another, as a CPU's train.fuse_repeats=auto trains them; fused ones: tests/test_fused.py.)"""
    settings = {"train.epochs": 2, "model.dropout": 0.1, "data.test_fraction": 0.2, "train.fuse_repeats": "off"}
    alone = {seed: [] for seed in (4, 5)}
    for seed, records in alone.items():
        train(
            tiny_config(**settings, **{"train.seed": seed}),
            lambda m, c, r=records: r.append(m.as_dict()),
            cache_dir=data_cache,
        )
    reports = []
    final = train(
        tiny_config(**settings, **{"train.seed": 4, "train.repeats": 2}),
        lambda m, c: reports.append((m.as_dict(), c)),
        cache_dir=data_cache,
    )
    for epoch, (record, checkpoint) in enumerate(reports):
        assert len(checkpoint.seeds) == 2
        for metric in (M.VAL_LOSS, M.VAL_TOKEN_ACCURACY, M.VAL_SEQUENCE_ACCURACY, *M.TEST_METRICS):
            seeds = M.seed_values(record, metric)
            assert sorted(seeds) == [4, 5]
            a, b = seeds.values()
            assert record[metric] == pytest.approx((a + b) / 2, abs=1e-12)
            assert record[M.stderr_key(metric)] == pytest.approx(abs(a - b) / 2, abs=1e-12)
        for seed, records in alone.items():
            for metric in (M.VAL_LOSS, M.VAL_TOKEN_ACCURACY, M.VAL_SEQUENCE_ACCURACY):
                assert record[M.seed_key(seed, metric)] == records[epoch][metric]
    assert reports[0][0][M.seed_key(4, M.VAL_LOSS)] != reports[0][0][M.seed_key(5, M.VAL_LOSS)]
    best = reports[final[M.BEST_EPOCH] - 1][0]
    assert final[M.VAL_TOKEN_ACCURACY] == max(r[M.VAL_TOKEN_ACCURACY] for r, _ in reports)
    assert {k: final[k] for k in final if M.is_spread(k)} == {k: v for k, v in best.items() if M.is_spread(k)}
    assert len([k for k in final if M.is_spread(k)]) == 6 * 3  # 6 metrics: a stderr and 2 seeds each


@pytest.mark.parametrize("repeats, latent_dim", [(1, None), (2, None), (1, 8)])
def test_resumed_run_ends_with_the_metrics_of_an_uninterrupted_one(
    tiny_config, data_cache, tmp_path, repeats, latent_dim
):
    config = tiny_config(
        **{
            "train.epochs": 4,
            "model.dropout": 0.1,
            "data.test_fraction": 0.2,
            "train.repeats": repeats,
            "model.latent_dim": latent_dim,
        }
    )
    full = []
    expected = train(config, lambda m, c: full.append(m.as_dict()), cache_dir=data_cache)

    state, _ = train_until(config, tmp_path / "ckpt", lambda m: m.epoch == 2, data_cache)
    assert state.epoch == 2
    resumed = []
    final = train(config, lambda m, c: resumed.append(m.as_dict()), resume=state, cache_dir=data_cache)
    assert [m[M.EPOCH] for m in resumed] == [3, 4]
    assert without_timing(resumed) == without_timing(full[2:])
    assert {k: v for k, v in final.items() if k not in {M.TOKENS_PER_S, M.TRAIN_SECONDS, M.DATA_SECONDS}} == {
        k: v for k, v in expected.items() if k not in {M.TOKENS_PER_S, M.TRAIN_SECONDS, M.DATA_SECONDS}
    }


@pytest.mark.parametrize(
    "settings, stop_after",
    [
        pytest.param({"train.validate_every": 0.25}, 3, id="quarters-killed-after-the-third"),
        pytest.param({"train.validate_every": 4}, 3, id="every-4-steps-killed-in-epoch-2"),
        pytest.param({"train.validate_every": 0.5, "train.repeats": 2}, 1, id="halves-2-seeds"),
        pytest.param(
            {"train.validate_every": 0.5, "train.repeats": 2, "train.fuse_repeats": "on"}, 3, id="halves-2-seeds-fused"
        ),
    ],
)
def test_a_run_killed_between_validations_of_an_epoch_resumes_there_with_the_uninterrupted_runs_numbers(
    tiny_config, data_cache, tmp_path, settings, stop_after
):
    """train.validate_every below an epoch: the run killed after validation ``stop_after``, mid-epoch,
    resumes from that validation's checkpoint, in the epoch's data order and with its random
    streams, and every later validation's metrics, its loss curve's points included, are the
    uninterrupted run's, exactly (the same operations on the same numbers, in the same order)."""
    config = tiny_config(
        **{"train.epochs": 2, "model.dropout": 0.1, "data.test_fraction": 0.2, "train.log_every_steps": 1, **settings}
    )
    full = []
    expected = train(config, lambda m, c: full.append(m.as_dict()), cache_dir=data_cache)

    state, store = train_until(config, tmp_path / "ckpt", lambda m: m.validation == stop_after, data_cache)
    assert state.step > 0  # between two epochs' ends
    assert state.place == f"at step {state.step} of epoch {state.epoch + 1}"
    assert store.progress().epoch == full[stop_after - 1][M.EPOCH]  # what a sweep reads: the epochs trained
    assert full[stop_after - 1][M.EPOCH] == state.epoch + state.step / (full[-1][M.GLOBAL_STEP] / 2)
    resumed = []
    final = train(config, lambda m, c: resumed.append(m.as_dict()), resume=state, cache_dir=data_cache)
    assert [m[M.VALIDATION] for m in resumed] == list(range(stop_after + 1, len(full) + 1))
    assert without_timing(resumed) == without_timing(full[stop_after:])
    assert all(m[M.TRAIN_LOSS_STEPS] for m in full[stop_after:])  # the curve's points are compared, not absent
    untimed = {M.TOKENS_PER_S, M.TRAIN_SECONDS, M.DATA_SECONDS}
    assert {k: v for k, v in final.items() if k not in untimed} == {
        k: v for k, v in expected.items() if k not in untimed
    }


def test_validations_between_epochs_ends_are_results_with_fractional_epochs(tiny_config, data_cache):
    """At train.validate_every=0.25 an epoch of 9 steps validates after steps 3, 5, 7 and 9 (the
    first step at or past each quarter), each a result: its epochs trained, its global step, its
    loss curve's points since the previous validation and its checkpoint's place in the epoch."""
    config = tiny_config(**{"train.epochs": 2, "train.validate_every": 0.25, "train.log_every_steps": 1})
    reports = []
    final = train(config, lambda m, c: reports.append((m.as_dict(), c)), cache_dir=data_cache)
    assert [m[M.GLOBAL_STEP] for m, _ in reports] == [3, 5, 7, 9, 12, 14, 16, 18]
    assert [m[M.EPOCH] for m, _ in reports] == [3 / 9, 5 / 9, 7 / 9, 1, 1 + 3 / 9, 1 + 5 / 9, 1 + 7 / 9, 2]
    assert [m[M.VALIDATION] for m, _ in reports] == list(range(1, 9))
    assert [(c.epoch, c.step) for _, c in reports] == [(0, 3), (0, 5), (0, 7), (1, 0), (1, 3), (1, 5), (1, 7), (2, 0)]
    assert [[s for s, _ in m[M.TRAIN_LOSS_STEPS]] for m, _ in reports[:2]] == [[1, 2, 3], [4, 5]]
    assert final[M.EPOCHS_RUN] == 2 and final[M.STOPPED_EARLY] is False


def test_patience_counts_epochs_whatever_the_validations_an_epoch(tiny_config, data_cache):
    """train.patience=1 at four validations an epoch: with a learning rate of ~0 nothing improves
    after the first validation, so the run stops four validations (one epoch) later, a third into
    epoch 2, and says so."""
    config = tiny_config(
        **{
            "train.epochs": 5,
            "train.validate_every": 0.25,
            "train.patience": 1,
            "train.lr": 1e-12,
            "train.lr_final": 1e-12,
        }
    )
    reports = []
    final = train(config, lambda m, c: reports.append((m.as_dict(), c)), cache_dir=data_cache)
    assert len(reports) == 5 and reports[-1][1].finished and reports[-1][1].patience_spent
    assert final[M.BEST_EPOCH] == 3 / 9 and final[M.EPOCHS_RUN] == 1 + 3 / 9 and final[M.STOPPED_EARLY] is True


def test_the_default_validates_once_an_epoch_as_validating_every_epochs_steps_does(tiny_config, data_cache):
    """Unset, train.validate_every is once an epoch: the results of setting it to an epoch's 9 steps,
    whole epochs numbered as their validations."""
    default, every_epoch = [], []
    train(tiny_config(), lambda m, c: default.append(m.as_dict()), cache_dir=data_cache)
    train(
        tiny_config(**{"train.validate_every": 9}), lambda m, c: every_epoch.append(m.as_dict()), cache_dir=data_cache
    )
    assert without_timing(default) == without_timing(every_epoch)
    assert [(m[M.EPOCH], m[M.VALIDATION], m[M.GLOBAL_STEP]) for m in default] == [(1, 1, 9), (2, 2, 18)]


@pytest.mark.parametrize(
    "every, message",
    [
        (10, "train.validate_every=10 steps is more than an epoch's 9 steps"),
        (0.1, "train.validate_every=0.1 asks for 10 validations an epoch, which has 9 steps"),
    ],
)
def test_validating_more_often_than_an_epoch_has_steps_is_refused_before_training(
    tiny_config, data_cache, every, message
):
    with pytest.raises(ConfigError, match=message):
        train(tiny_config(**{"train.validate_every": every}), lambda m, c: pytest.fail("trained"), cache_dir=data_cache)


def test_validation_steps_fall_at_or_just_past_each_share_of_the_epoch():
    assert validation_steps(TrainConfig(), 95) == [95]
    assert validation_steps(TrainConfig(validate_every=30), 95) == [30, 60, 90, 95]
    assert validation_steps(TrainConfig(validate_every=0.25), 95) == [24, 48, 72, 95]
    assert validation_steps(TrainConfig(validate_every=0.333), 10) == [4, 7, 10]
    assert validation_steps(TrainConfig(validate_every=0.5), 2) == [1, 2]


def test_a_state_saved_before_validate_every_resumes_at_the_next_epochs_start():
    """A format-1 state written without ``step`` (before validations between epochs' ends) reads as
    one at its epoch's end: the run goes on at step 0 of the next epoch."""
    state = {
        "format": 1,
        "config": {},
        "epoch": 3,
        "model": {},
        "optimizer": {},
        "scheduler": {},
        "rng": {},
        "early_stopping": {},
        "history": [{}, {}, {}],
        "finished": False,
        "patience_spent": False,
        "token_ids": torch.zeros(1),
    }
    checkpoint = Checkpoint.of_state(state)
    assert (checkpoint.epoch, checkpoint.step, checkpoint.number) == (3, 0, 3)


def test_a_finished_run_given_more_epochs_trains_on_as_if_it_had_had_them(tiny_config, data_cache, tmp_path):
    """`seqae sweep extend --epochs`: the run that stopped at its last epoch, 2, continues to 4
    with the metrics of a run given 4 epochs from the start; its records say when it is done."""
    config = tiny_config(**{"train.epochs": 4, "train.patience": 5})
    full = []
    train(config, lambda m, c: full.append(m.as_dict()), cache_dir=data_cache)
    store = CheckpointStore(str(tmp_path / "ckpt"))
    short = tiny_config(**{"train.epochs": 2, "train.patience": 5})
    train(short, store.save, cache_dir=data_cache)
    assert store.progress().done() and not store.progress().done(epochs=4)
    state, _ = store.resume()
    assert train(short, resume=state, cache_dir=data_cache)[M.EPOCHS_RUN] == 2  # nothing left at its own limit
    longer = []
    train(config, lambda m, c: (longer.append(m.as_dict()), store.save(m, c)), resume=state, cache_dir=data_cache)
    assert [m[M.EPOCH] for m in longer] == [3, 4]
    assert without_timing(longer) == without_timing(full[2:])
    assert store.progress().done(epochs=4) and [h[M.EPOCH] for h in store.progress().history] == [1, 2, 3, 4]


def test_resume_refuses_a_checkpoint_of_another_config(tiny_config, data_cache):
    states = []
    train(tiny_config(**{"train.epochs": 1}), lambda m, c: states.append(c), cache_dir=data_cache)
    with pytest.raises(ValueError, match="another config"):
        train(tiny_config(**{"train.epochs": 1, "train.lr": 0.01}), resume=states[0], cache_dir=data_cache)


def test_non_finite_loss_names_epoch_and_step(tiny_config, data_cache):
    # AdamW moves every weight by about lr per step: at 1e30 the logits overflow at once.
    with pytest.raises(NonFiniteLossError, match=r"at epoch 1, step [0-9]+"):
        train(tiny_config(**{"train.lr": 1e30, "train.lr_schedule": "constant"}), cache_dir=data_cache)


def test_learning_rate_schedules():
    for schedule, input_len in (("linear", 512), ("paper", 256)):
        linear = lr_factor(TrainConfig(lr=1e-3, lr_final=1e-4, lr_schedule=schedule), 10, input_len)
        assert [round(linear(s) * 1e-3, 10) for s in (0, 25, 50, 80)] == [1e-3, 5.5e-4, 1e-4, 1e-4]
    static = lr_factor(TrainConfig(lr=1e-3, lr_final=1e-4, lr_schedule="paper"), 10, input_len=512)
    assert round(static(0) * 1e-3, 10) == round(static(80) * 1e-3, 10) == 1e-4  # above 256 tokens
    constant = lr_factor(TrainConfig(lr=1e-4, lr_schedule="constant"), 10, 64)
    assert constant(0) == constant(1000) == 1.0


def test_early_stopping_patience():
    stopper = EarlyStopping(patience=2)
    assert stopper.update(0.5, 1) and not stopper.should_stop
    assert not stopper.update(0.5, 2)  # equal is not better
    assert not stopper.update(0.4, 3) and stopper.should_stop
    assert (stopper.best, stopper.best_epoch) == (0.5, 1)


def test_seqae_train_stops_five_epochs_after_the_best_at_the_papers_patience(data_cache, capsys):
    """`seqae train` at its default patience, the paper's 5: with a learning rate of ~0 nothing
    improves after epoch 1, so it trains exactly 5 epochs more (of the 20 allowed), then stops."""
    # 3 pages in batches of 128: 6 epochs of these cost less than the 3 of 6 pages this test once trained
    overrides = {
        **TINY,
        "data.max_pages": 3,
        "train.batch_size": 128,
        "train.epochs": 20,
        "train.lr": 1e-12,
        "train.lr_final": 1e-12,
    }
    # (train.patience is left at its default)
    assert (
        main(["train", "--json", "--cache-dir", str(data_cache), *[a for s in sets(overrides) for a in ("--set", s)]])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    final = json.loads(out[-1])
    assert final[M.BEST_EPOCH] == 1 and final[M.STOPPED_EARLY] is True
    assert final[M.EPOCHS_RUN] == final[M.BEST_EPOCH] + 5 == 6
    assert [line.split(":")[0] for line in out if line.startswith("epoch ")] == [f"epoch {e}" for e in range(1, 7)]


def test_checkpoint_store_falls_back_past_a_damaged_record(tmp_path):
    store = CheckpointStore(str(tmp_path), keep=3)
    for epoch in (1, 2, 3):
        store.save_epoch(epoch, {"epoch": epoch, "w": torch.full((4,), float(epoch))})
    state_file = tmp_path / "epoch-000003" / "state.pt"
    state_file.write_bytes(state_file.read_bytes()[:-7])  # truncated
    (tmp_path / "epoch-000002" / "manifest.json").unlink()  # never finished
    loaded = store.latest()
    assert loaded.epoch == 1 and tensors(loaded.files["state.pt"])["w"].tolist() == [1.0] * 4
    assert [s.split(":")[0] for s in loaded.skipped] == ["epoch-000003", "epoch-000002"]
    store.save_epoch(2, {"epoch": 2})  # a resumed run rewrites epoch 2 whole
    assert store.latest().epoch == 2


def test_an_object_store_lease_stops_a_stale_writer_before_it_writes(s3, monkeypatch, tmp_path):
    """On a real S3 server: a trial resumed elsewhere takes its store's lease; the writer that
    outlived its driver then fails its next record with LeaseLost, and writes nothing."""
    from seqae_core.records import LeaseLost

    for key, value in s3.items():
        monkeypatch.setenv(key, value)
    uri = f"s3://seqae/{tmp_path.name}/trials/0000"
    stale, resumed = CheckpointStore(uri), CheckpointStore(uri)
    with stale.exclusive():
        stale.save_epoch(1, {"epoch": 1})
        with resumed.exclusive():
            resumed.save_epoch(2, {"epoch": 2})
            with pytest.raises(LeaseLost, match="a newer writer"):
                stale.save_epoch(3, {"epoch": 3})
            with pytest.raises(LeaseLost):
                stale.record_verdict("would repeat")
            resumed.save_epoch(3, {"epoch": 3})
    assert tensors(resumed.latest().files["state.pt"]) == {"epoch": 3} and resumed.verdict() is None
    assert sorted(resumed._epochs("epoch")) == [2, 3]  # keep=2; epoch 3 is the resumed writer's own


@pytest.mark.parametrize("values", [[0.5, 0.7, 0.7, 0.6], [0.9, 0.1, 0.9], [0.2, 0.3, 0.4], [0.4]])
def test_the_kept_epoch_is_the_one_early_stopping_keeps(values):
    """One rule, seqae_core.metrics.kept_epoch, read by the study and the report: the first of the best."""
    stopper = EarlyStopping(patience=5)
    for epoch, value in enumerate(values, 1):
        stopper.update(value, epoch)
    assert M.kept_epoch(enumerate(values, 1)) == stopper.best_epoch
    assert M.kept_epoch([]) is None
