from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pydantic
import pytest

from seqae.cli.main import main
from seqae_core.checkpoint import CheckpointStore
from seqae_core.config import Config, TrainConfig, coerce, from_flat, load, to_yaml
from seqae_errors import ConfigError
from tests.conftest import TINY, sets
from tests.refusal import assert_refused


def test_defaults_are_the_papers_recipe():
    c = Config()
    assert (c.model.d_model, c.model.d_attn, c.train.batch_size) == (256, 512, 16)
    assert (c.train.lr, c.train.lr_final, c.train.lr_decay_epochs) == (1e-3, 1e-4, 5)
    assert c.train.lr_schedule == "paper"  # linear up to 256 tokens, static 1e-4 above
    assert (c.train.epochs, c.train.patience, c.data.val_fraction) == (20, 5, 0.2)
    assert (c.data.path, c.data.name, c.data.tokenizer) == ("wikimedia/wikipedia", "20231101.en", "bert-base-uncased")
    assert c.latent_len == 256  # half of 512 unless told otherwise


def test_latent_fraction_resolves_against_the_input_length():
    assert from_flat({"data.input_len": 64, "model.latent_fraction": 0.25}).latent_len == 16
    assert from_flat({"data.input_len": 128, "model.latent_len": 72}).latent_fraction == 72 / 128


def test_the_latents_size_counts_its_tokens_and_their_width():
    """Shortening and narrowing compress alike: 16 of 64 tokens at full width, and 64 tokens of a
    quarter of the width, are each a quarter of the embedded input's floats."""
    shorter = from_flat({"data.input_len": 64, "model.d_model": 128, "model.latent_len": 16})
    narrower = from_flat({"data.input_len": 64, "model.d_model": 128, "model.latent_len": 64, "model.latent_dim": 32})
    assert (shorter.latent_floats, shorter.latent_share) == (16 * 128, 0.25)
    assert (narrower.latent_floats, narrower.latent_share) == (64 * 32, 0.25)


def test_yaml_round_trip(tmp_path):
    config = from_flat(TINY)
    path = tmp_path / "c.yaml"
    path.write_text(to_yaml(config))
    assert load(path) == config
    assert from_flat(config.flat()) == config


def test_set_values_are_typed():
    config = load(None, ["train.lr=1e-3", "data.max_pages=null", "model.dropout=0", "train.seed=7"])
    assert config.train.lr == 0.001 and config.data.max_pages is None
    assert config.model.dropout == 0.0 and config.train.seed == 7


@pytest.mark.parametrize(
    "key, value, read",
    [
        pytest.param("model.d_model", 64.0, 64, id="a-whole-float-is-an-integer"),
        pytest.param("train.lr", "1e-3", 0.001, id="yaml-leaves-1e-3-a-string"),
        pytest.param("train.lr", 1, 1.0, id="an-integer-is-a-number"),
        pytest.param("train.validate_every", 2.0, 2, id="steps-before-fractions"),
        pytest.param("train.validate_every", "0.5", 0.5, id="a-fraction-in-a-string"),
        pytest.param("data.name", None, None, id="null"),
    ],
)
def test_a_value_is_read_as_its_keys_type(key, value, read):
    coerced = coerce(key, value, "test")
    assert (coerced, type(coerced)) == (read, type(read))


@pytest.mark.parametrize(
    "key, value, must",
    [
        pytest.param("model.d_model", True, "an integer", id="true-is-not-1"),
        pytest.param("model.d_model", "64", "an integer", id="a-string-is-not-an-integer"),
        pytest.param("train.lr", True, "a finite number", id="true-is-not-a-number"),
        pytest.param("train.lr", np.True_, "a finite number", id="nor-numpys-true"),
        pytest.param("train.lr", 10**400, "a finite number", id="an-integer-beyond-floats"),
        pytest.param("model.tie_embeddings", 1, "true or false", id="1-is-not-true"),
        pytest.param("train.compile", True, "one of 'auto', 'on', 'off'", id="yamls-on-is-true"),
        pytest.param("data.path", 3, "a string", id="a-number-is-not-a-string"),
    ],
)
def test_a_value_of_another_type_is_refused_in_one_line(key, value, must):
    with pytest.raises(ConfigError) as refused:
        coerce(key, value, "test")
    assert str(refused.value) == f"test: {key}={value!r} must be {must}"


def test_the_sections_check_their_types_when_built_directly_and_stay_frozen_and_hashable():
    with pytest.raises(pydantic.ValidationError):
        TrainConfig(lr="fast")
    config = from_flat(TINY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.train.lr = 1.0  # type: ignore[misc]
    assert {config: 1}[from_flat(config.flat())] == 1


@pytest.mark.parametrize(
    "bad, message",
    [
        pytest.param(["model.d_modle=64"], "unknown key 'model.d_modle'", id="unknown-key"),
        pytest.param(["model.d_model=big"], "model.d_model='big' must be an integer", id="wrong-type"),
        pytest.param(["train.epochs=2.5"], "train.epochs=2.5 must be an integer", id="float-for-int"),
        pytest.param(["model.block=lstm"], "model.block='lstm' must be one of 'paper', 'transformer'", id="bad-choice"),
        pytest.param(["train.lr=nan"], "train.lr=nan must be a finite number", id="nan"),
        pytest.param(
            ["data.input_len=32", "model.latent_len=33"],
            "model.latent_len=33 must be in 1..data.input_len=32",
            id="latent-longer-than-input",
        ),
        pytest.param(["model.d_model=0"], "model.d_model=0 must be positive", id="zero-size"),
        pytest.param(["train.batch_size=-4"], "train.batch_size=-4 must be positive", id="negative-size"),
        pytest.param(["train.log_every_steps=0"], "train.log_every_steps=0 must be positive", id="zero-log-steps"),
        pytest.param(
            ["model.d_attn=100", "model.heads=3"], "model.d_attn=100 must be divisible by model.heads=3", id="heads"
        ),
        pytest.param(["model.latent_len=8", "model.latent_fraction=0.5"], "not both", id="latent-twice"),
        pytest.param(
            ["model.d_model=64", "model.latent_dim=65"],
            "model.latent_dim=65 must be in 1..model.d_model=64",
            id="latent-wider-than-the-model",
        ),
        pytest.param(["train.lr"], "expected key=value", id="no-equals"),
        *[
            pytest.param(
                [f"train.validate_every={v}"],
                f"train.validate_every={v} must be a whole number of steps "
                "(1 or more) or a fraction of an epoch of the form 1/k",
                id=f"validate-every-{v}",
            )
            for v in ("0", "-3", "1.5", "0.3", "-0.25")
        ],
        pytest.param(
            ["train.validate_every=often"],
            "train.validate_every='often' must be an integer or a finite number or null",
            id="validate-every-a-word",
        ),
    ],
)
def test_cli_rejects_bad_input_before_loading_data(bad, message, capsys, tmp_path):
    # data.path points nowhere: the error must come from the config, before any data loads or any
    # checkpoint folder is made.
    made = (tmp_path / "ckpt", tmp_path / "cache")
    code = main(
        [
            "train",
            "--checkpoint-dir",
            str(made[0]),
            "--cache-dir",
            str(made[1]),
            "--set",
            "data.path=/nonexistent",
            *[a for s in bad for a in ("--set", s)],
        ]
    )
    assert_refused(code, capsys.readouterr().err, message, created=made)


def test_config_file_errors_name_the_file_and_key(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  d_model: 64\n  colour: red\n")
    made = (tmp_path / "ckpt", tmp_path / "cache")
    code = main(["train", "--config", str(path), "--checkpoint-dir", str(made[0]), "--cache-dir", str(made[1])])
    err = capsys.readouterr().err
    assert_refused(code, err, "unknown key 'model.colour'", created=made)
    assert str(path) in err


def test_a_config_file_that_is_not_utf8_is_one_line_naming_it(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"model:\n  d_model: \xff\xfe\n")
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"seqae: error: {path}: not valid YAML: 'utf-8' codec can't decode byte 0xff")
    assert len(err.strip().splitlines()) == 1, err


SMALL = {**TINY, "data.max_pages": 3}  # whole runs in a subprocess: what they check does not depend on the size


def test_the_cli_shows_its_own_info_lines_and_other_libraries_only_from_warning(tmp_path):
    """matplotlib's "generated new fontManager" and datasets' "JAX version ... available" are INFO
    lines of theirs, which a user who ran `seqae` did not ask for; seqae's own INFO lines stay."""
    code = (
        "import logging, sys; from seqae.cli.main import main; main(['sweep', 'list', '--workspace', sys.argv[1]]); "
        "logging.getLogger('matplotlib.font_manager').info('generated new fontManager'); "
        "logging.getLogger('datasets.config').warning('a warning of theirs'); "
        "logging.getLogger('sweeps.running.driver').info('a line of seqae')"
    )
    err = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True).stderr
    assert err.splitlines() == ["a warning of theirs", "a line of seqae"]


def test_train_command_prints_json_last(data_cache, tmp_path, capsys):
    """The real console script, end to end on the tiny config; then its refusals of that folder,
    through the same entry point in this process."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "seqae",
            "train",
            "--json",
            "--cache-dir",
            str(data_cache),
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            *[a for s in sets(SMALL) for a in ("--set", s)],
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    final = json.loads(run.stdout.strip().splitlines()[-1])
    for key in (
        "val_token_accuracy",
        "val_loss",
        "val_sequence_accuracy",
        "best_epoch",
        "epochs_run",
        "stopped_early",
        "tokens_per_s",
        "train_seconds",
        "data_seconds",
    ):
        assert key in final
    assert final["epochs_run"] == 2
    store = CheckpointStore(str(tmp_path / "ckpt"))
    assert store.progress().epoch == 2
    best = Path(store.records("best")[-1])
    assert "reconstructed:" in (best / "samples.txt").read_text()
    records = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    # the folder now holds a run: reusing it without --resume is refused, nothing overwritten, and
    # no data prepared (a cache folder of its own shows it)
    code = main(
        [
            "train",
            "--cache-dir",
            str(tmp_path / "refused-cache"),
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            *[a for s in sets(SMALL) for a in ("--set", s)],
        ]
    )
    assert_refused(code, capsys.readouterr().err, "pass --resume", created=(tmp_path / "refused-cache",))
    # resuming it with another config is one line naming what changed, not a traceback
    changed = {**SMALL, "model.d_model": SMALL["model.d_model"] * 2}
    code = main(
        [
            "train",
            "--resume",
            "--cache-dir",
            str(data_cache),
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            *[a for s in sets(changed) for a in ("--set", s)],
        ]
    )
    assert_refused(
        code,
        capsys.readouterr().err,
        f"model.d_model={SMALL['model.d_model']} -> {changed['model.d_model']}",
        created=(tmp_path / "ckpt" / "epoch-000003",),
    )  # the epoch a resume would train
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == records
    assert CheckpointStore(str(tmp_path / "ckpt")).progress().epoch == 2


def test_the_transformer_block_has_defaults_of_its_own_and_a_set_key_wins():
    from seqae_core.config import from_flat

    transformer = from_flat({"model.block": "transformer"})
    assert (transformer.model.heads, transformer.model.dropout, transformer.train.lr) == (8, 0.1, 2e-3)
    paper = from_flat({})  # the paper block keeps the paper's
    assert (paper.model.block, paper.model.heads, paper.model.dropout, paper.train.lr) == ("paper", 1, 0.0, 1e-3)
    pinned = from_flat({"model.block": "transformer", "model.heads": 2, "train.lr": 1e-3})
    assert (pinned.model.heads, pinned.model.dropout, pinned.train.lr) == (2, 0.1, 1e-3)
    with pytest.raises(ConfigError, match="model.d_attn=100 must be divisible by model.heads=8"):
        from_flat({"model.block": "transformer", "model.d_attn": 100})
