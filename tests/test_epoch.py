"""The epoch record (seqae_core.epoch) and the typed records that carry it across Ray Tune: its
serialized form is what checkpoints, ``metrics.json``, Tune and MLflow have always held."""

from __future__ import annotations

import dataclasses

import pytest

from seqae_core import metrics as M
from seqae_core.epoch import EpochRecord
from sweeps.running.tune_result import TrialResult, of_tune, to_tune
from sweeps.spec.trial import TrialSpec, WorkerSpec


@pytest.fixture
def record() -> EpochRecord:
    return EpochRecord(
        epoch=1,
        validation=1,
        train_loss=2.5,
        val_loss=2.0,
        val_token_accuracy=0.5,
        val_sequence_accuracy=0.0,
        lr=1e-3,
        tokens_per_s=1000.0,
        epoch_seconds=3.0,
        epoch_cpu_seconds=5.0,
        validation_cpu_seconds=0.5,
        latent_fraction=0.5,
        latent_floats=256,
        latent_share=0.5,
        best_epoch=1,
        best_val_token_accuracy=0.5,
        data_seconds=0.1,
        global_step=9,
        train_loss_steps=((3, 2.7), (6, 2.6), (9, 2.5)),
    )


@pytest.mark.parametrize(
    "change, message",
    [
        pytest.param({"validation": 0}, "validation=0 and epoch=1 must be positive", id="validation"),
        pytest.param({"train_loss": float("nan")}, "train_loss=nan is not finite", id="nan-loss"),
        pytest.param({"val_token_accuracy": 1.5}, r"val_token_accuracy=1.5 must be in \[0, 1\]", id="accuracy"),
        pytest.param(
            {"spread": {"seed_1/lr": 0.1}}, r"spread holds \['seed_1/lr'\]", id="spread-of-an-unscored-metric"
        ),
        pytest.param({"system": {"cpu": 1.0}}, r"system metrics \['cpu'\] must start with 'system/'", id="system"),
    ],
)
def test_a_record_is_checked_when_made(record, change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(record, **change)


def test_a_record_missing_a_metric_is_refused_by_name(record):
    serialized = record.as_dict()
    del serialized[M.VAL_LOSS]
    with pytest.raises(KeyError, match=M.VAL_LOSS):
        EpochRecord.of_dict(serialized)


def test_a_trial_result_crosses_tune_and_back(record):
    """What the worker hands tune.report, with the keys Tune adds to every result, reads back as it was."""
    result = TrialResult(3, record, False, {"node_id": "abc"}, {"gpu": "cuda", "gpu_ids": "0"})
    tune_dict = to_tune(result)
    assert tune_dict[M.VAL_TOKEN_ACCURACY] == 0.5 and tune_dict["trial"] == 3 and tune_dict["finished"] is False
    from_tune = of_tune(
        {
            **tune_dict,
            "node_ip": "10.0.0.1",
            "hostname": "h",
            "training_iteration": 1,
            "time_this_iter_s": 3.0,
            "config": {"trial": None},
        }
    )
    assert from_tune == dataclasses.replace(result, node={"node_id": "abc", "node_ip": "10.0.0.1", "hostname": "h"})
    with pytest.raises(ValueError, match=r"names \['gpu_count'\]"):
        TrialResult(3, record, False, {}, {"gpu_count": "1"})


def test_a_worker_spec_crosses_tune_and_back():
    one, two = TrialSpec(1, {}, None), TrialSpec(2, {}, None)
    assert WorkerSpec.of_tune(WorkerSpec(one).to_tune()) == WorkerSpec(one)
    assert WorkerSpec(one).to_tune() == {"trial": one}
    assert WorkerSpec.of_tune({**WorkerSpec(one, (one, two)).to_tune(), "pack_tune_id": "x"}) == WorkerSpec(
        one, (one, two)
    )
    with pytest.raises(ValueError, match=r"members \[2, 1\] must be distinct trials, trial 1 first"):
        WorkerSpec(one, (two, one))
