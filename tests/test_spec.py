"""Sweep files: every study parses, and malformed ones are refused before anything is created."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from seqae.cli.main import main
from seqae_errors import ConfigError
from sweeps.spec import sweep as spec_lib
from tests.refusal import assert_refused

STUDIES = sorted((Path(__file__).resolve().parents[1] / "sweeps" / "studies").glob("*.yaml"))

GOOD = {
    "config": {"data": {"input_len": 32}, "model": {"block": "transformer"}},
    "grid": {"model.latent_fraction": [1.0, 0.5]},
    "search": {"train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
    "objective": {"metric": "val_token_accuracy", "mode": "max"},
    "trials": {"per_cell": 2},
}


SEARCH = {
    "config": {"data": {"input_len": 32}, "model": {"block": "transformer"}},
    "search": {"train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
    "trials": {"total": 4},
}


def write(tmp_path: Path, doc: object, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_every_study_parses_and_comments_every_setting(path):
    spec = spec_lib.load(path)
    assert spec.planned_trials() >= 1
    assert spec_lib.parse(spec.to_dict(), str(path)) == spec  # the stored form reloads identically
    for number, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        if code.strip() and not code.strip().startswith("-") and ":" in code and not code.rstrip().endswith(":"):
            assert "#" in line, f"{path.name}:{number} has a setting without a comment: {line.strip()}"


GPU_STUDIES = ["paper_fig2", "paper_fig3", "paper_seeds", "search_lr_dims", "frontier"]


@pytest.mark.parametrize("study", GPU_STUDIES)
def test_the_paper_and_search_studies_run_on_gpus_with_one_flag_and_the_same_settings(study):
    """``--profile gpu`` changes where trials run (an eighth of a GPU, two cores) and how many at
    once, and nothing they train: the same cells, config and search as the file's own."""
    plain = spec_lib.load(STUDIES[0].parent / f"{study}.yaml")
    gpu = spec_lib.load(STUDIES[0].parent / f"{study}.yaml", ["profile=gpu"])
    assert gpu.resources.gpu == 0.125 and gpu.resources.cpu == 2 and plain.resources.gpu == 0
    assert gpu.base == plain.base and gpu.cells() == plain.cells() and gpu.search == plain.search
    assert gpu.planned_trials() == plain.planned_trials()
    assert min(8, gpu.planned_trials()) <= gpu.max_concurrent <= max(8, gpu.planned_trials())  # a GPU full, at least


def test_grid_cells_and_trial_count():
    spec = spec_lib.parse(GOOD, "good")
    assert spec.cells() == [{"model.latent_fraction": 1.0}, {"model.latent_fraction": 0.5}]
    assert spec.planned_trials() == 4
    assert spec.sampler.type == "tpe" and not spec.multi_objective


def test_multi_objective_defaults_to_nsga2():
    doc = {
        **GOOD,
        "objective": [{"metric": "val_token_accuracy", "mode": "max"}, {"metric": "latent_fraction", "mode": "min"}],
    }
    spec = spec_lib.parse(doc, "mo")
    assert spec.multi_objective and spec.sampler.type == "nsga2"


def test_set_pins_a_key_out_of_the_search_and_addresses_sweep_settings(tmp_path):
    path = write(tmp_path, GOOD)
    spec = spec_lib.load(path, ["train.lr=0.001", "trials.per_cell=1", "grid.data.input_len=[16, 32]"])
    assert "train.lr" not in spec.search and spec.base["train.lr"] == 0.001
    assert spec.grid["data.input_len"] == (16, 32) and spec.planned_trials() == 4


def test_a_relative_local_data_path_becomes_absolute_and_a_hub_name_stays(tmp_path, monkeypatch):
    path = write(tmp_path, GOOD)
    (tmp_path / "pages").mkdir()
    monkeypatch.chdir(tmp_path)
    assert spec_lib.load(path, ["data.path=pages"]).base["data.path"] == str(tmp_path / "pages")
    assert spec_lib.load(path, ["data.path=wikimedia/wikipedia"]).base["data.path"] == "wikimedia/wikipedia"


BAD = [
    pytest.param({**GOOD, "colour": "red"}, "unknown key 'colour'", id="unknown-top-key"),
    pytest.param({**GOOD, "config": {"model": {"d_modle": 3}}}, "unknown key 'model.d_modle'", id="unknown-config-key"),
    pytest.param(
        {**GOOD, "config": {"data": {"sep": {}}}}, "unknown key 'data.sep'", id="unknown-config-key-empty-mapping"
    ),
    pytest.param(
        {**GOOD, "config": {"model": {"d_model": "wide"}}}, "model.d_model='wide' must be an integer", id="wrong-type"
    ),
    pytest.param(
        {**GOOD, "search": {"train.lr": {"type": "loguniform", "low": float("nan"), "high": 1.0}}},
        "search.train.lr.low=nan must be a finite number",
        id="nan-bound",
    ),
    pytest.param(
        {**GOOD, "search": {"train.lr": {"type": "uniform", "low": 0.0, "high": float("inf")}}},
        "search.train.lr.high=inf must be a finite number",
        id="inf-bound",
    ),
    pytest.param(
        {**GOOD, "search": {"train.lr": {"type": "uniform", "low": 0.1, "high": 0.01}}},
        "low=0.1 is greater than high=0.01",
        id="low-above-high",
    ),
    pytest.param(
        {**GOOD, "search": {"train.lr": {"type": "loguniform", "low": 0.0, "high": 0.01}}},
        "low=0.0 must be positive on a log scale",
        id="log-low-zero",
    ),
    pytest.param(
        {**GOOD, "search": {"model.d_model": {"type": "categorical", "choices": []}}},
        "search.model.d_model: choices=[] must be a non-empty list",
        id="empty-choices",
    ),
    pytest.param(
        {**GOOD, "search": {"model.d_model": {"type": "ordered", "choices": [256, 128, 512]}}},
        "search.model.d_model: choices=[256, 128, 512] must be in increasing order for type 'ordered'",
        id="ordered-out-of-order",
    ),
    pytest.param(
        {**GOOD, "search": {"model.d_model": {"type": "ordered", "choices": [128, 128]}}},
        "search.model.d_model: choices=[128, 128] must be a non-empty list without repeats",
        id="ordered-repeats",
    ),
    pytest.param(
        {**GOOD, "search": {"model.d_model": {"type": "ordered", "choices": [128, 256], "low": 128}}},
        "search.model.d_model: 'low' does not apply to type 'ordered'",
        id="ordered-with-bounds",
    ),
    pytest.param(
        {**GOOD, "search": {"model.d_model": {"type": "ordered", "choices": [128, "wide"]}}},
        "model.d_model='wide' must be an integer",
        id="ordered-not-a-width",
    ),
    pytest.param(
        {**GOOD, "search": {"model.latent_fraction": {"type": "uniform", "low": 0.1, "high": 0.9}}},
        "model.latent_fraction is in both grid and search",
        id="grid-and-search",
    ),
    pytest.param({**GOOD, "trials": {"total": 0}}, "trials.total=0 must be greater than 0", id="zero-trials"),
    pytest.param(
        {**GOOD, "trials": {"per_cell": -3}}, "trials.per_cell=-3 must be greater than 0", id="negative-trials"
    ),
    pytest.param(
        {**GOOD, "objective": {"metric": "bleu", "mode": "max"}},
        "objective[0]: metric='bleu' is not reported",
        id="unknown-metric",
    ),
    pytest.param(
        {**GOOD, "objective": {"metric": "val_loss", "mode": "lowest"}},
        "objective[0].mode='lowest' must be 'min' or 'max'",
        id="bad-mode",
    ),
    pytest.param({**GOOD, "scheduler": {"type": "bohb"}}, "scheduler.type='bohb'", id="bad-scheduler"),
    pytest.param(
        {
            **GOOD,
            "scheduler": {"type": "race"},
            "objective": [
                {"metric": "val_token_accuracy", "mode": "max"},
                {"metric": "latent_fraction", "mode": "min"},
            ],
        },
        "scheduler.type='race' races one objective's best; this sweep has 2",
        id="race-with-two-objectives",
    ),
    pytest.param(
        {
            **GOOD,
            "objective": [
                {"metric": "val_token_accuracy", "mode": "max", "target": 0.9},
                {"metric": "latent_fraction", "mode": "min"},
            ],
        },
        "objective.target needs one objective",
        id="target-with-two-objectives",
    ),
    pytest.param(
        {**GOOD, "budget": {"gpu_hours": 2}},
        "budget.gpu_hours, but trials are counted in cpu-hours",
        id="budget-in-the-wrong-unit",
    ),
    pytest.param(
        {**GOOD, "checkpoints": {"keep_best": 0}},
        "checkpoints.keep_best=0 must be greater than or equal to 1",
        id="keep-no-checkpoint",
    ),
    pytest.param(
        {**GOOD, "budget": {"cpu_hours": -1}}, "budget.cpu_hours=-1 must be greater than 0", id="negative-budget"
    ),
    pytest.param(
        {**GOOD, "objective": {"metric": "val_loss", "mode": "min", "target": "low"}},
        "objective[0].target='low' must be a valid number",
        id="target-not-a-number",
    ),
    pytest.param({**GOOD, "resources": {"cpu": 0}}, "resources.cpu=0 must be greater than 0", id="zero-cpu"),
    pytest.param(
        {**GOOD, "grid": {"model.latent_len": [8, 64]}, "config": {"data": {"input_len": 32}}},
        "model.latent_len=64 must be in 1..data.input_len=32",
        id="grid-cell-invalid",
    ),
    pytest.param(
        {**GOOD, "search": {"model.d_model": {"type": "uniform", "low": 16, "high": 64}}},
        "model.d_model is an integer",
        id="float-search-on-int",
    ),
    # Test metrics are never chosen on: not as the objective, nor its target, nor ASHA's metric (the objective's).
    pytest.param(
        {**GOOD, "objective": {"metric": "test_token_accuracy", "mode": "max"}},
        "objective[0]: metric='test_token_accuracy' is measured on the test pages",
        id="test-objective",
    ),
    pytest.param(
        {**GOOD, "objective": {"metric": "test_loss", "mode": "min", "target": 0.5}},
        "objective[0]: metric='test_loss' is measured on the test pages",
        id="test-target",
    ),
    pytest.param(
        {**GOOD, "objective": {"metric": "test_sequence_accuracy", "mode": "max"}, "scheduler": {"type": "asha"}},
        "objective[0]: metric='test_sequence_accuracy' is measured on the test pages",
        id="test-scheduler-metric",
    ),
    # Starting points: whole configurations inside the searched space, before proposals, within the trial budget.
    pytest.param(
        {**SEARCH, "start": {"paper": {"train.lr": 0.5}}},
        "start.paper: train.lr=0.5 (its value) is outside search.train.lr",
        id="start-outside-the-space",
    ),
    pytest.param(
        {
            **SEARCH,
            "search": {"model.d_model": {"type": "categorical", "choices": [32, 64]}},
            "start": {"defaults": {}},
        },
        "start.defaults: model.d_model=256 (the base config's value (the point does not set it)) is outside "
        "search.model.d_model",
        id="start-default-outside-the-space",
    ),
    pytest.param(
        {**GOOD, "start": {"paper": {}}}, "start: a grid lists its configurations already", id="start-with-grid"
    ),
    pytest.param(
        {**SEARCH, "trials": {"total": 1}, "start": {"a": {}, "b": {"train.lr": 0.002}}},
        "start: 2 starting points, but the sweep plans 1 trials",
        id="more-starts-than-trials",
    ),
    pytest.param(
        {**SEARCH, "start": {"paper": {"model.wdth": 3}}},
        "start.paper: unknown key 'model.wdth'",
        id="start-unknown-key",
    ),
    pytest.param({**SEARCH, "start": {"a b": {}}}, "start: 'a b' is not a name", id="start-bad-name"),
    pytest.param({**SEARCH, "start": ["paper"]}, "start must map names to configurations", id="start-not-a-mapping"),
    # Conditions name a grid axis or an earlier searched key, and values it takes.
    pytest.param(
        {
            **SEARCH,
            "search": {
                **SEARCH["search"],
                "model.heads": {"type": "categorical", "choices": [1, 2], "when": {"model.blok": "transformer"}},
            },
        },
        "search.model.heads.when.model.blok: model.blok is not a grid axis or another searched key",
        id="condition-on-unknown-key",
    ),
    pytest.param(
        {
            **SEARCH,
            "search": {
                "model.block": {"type": "categorical", "choices": ["paper", "transformer"]},
                "model.heads": {"type": "categorical", "choices": [1, 2], "when": {"model.block": "transfomer"}},
            },
        },
        "search.model.heads.when.model.block: model.block='transfomer' is a value model.block never takes",
        id="condition-impossible-value",
    ),
    pytest.param(
        {
            **SEARCH,
            "search": {
                "model.dropout": {"type": "uniform", "low": 0, "high": 0.2, "when": {"train.lr_schedule": "linear"}},
                "train.lr_schedule": {
                    "type": "categorical",
                    "choices": ["linear", "paper"],
                    "when": {"model.dropout": 0.1},
                },
            },
        },
        "the conditions of search.model.dropout, search.train.lr_schedule name each other in a cycle",
        id="conditions-in-a-cycle",
    ),
    # Sampler settings apply to their sampler; GP models numbers only.
    pytest.param(
        {**SEARCH, "sampler": {"type": "random", "n_startup_trials": 3}},
        "sampler: 'n_startup_trials' does not apply to type 'random'",
        id="startup-for-random",
    ),
    pytest.param(
        {**SEARCH, "sampler": {"type": "gp", "multivariate": True}},
        "sampler: 'multivariate' does not apply to type 'gp'",
        id="multivariate-for-gp",
    ),
    # a misspelt type leaves the default (NSGA-II for two objectives): the typo is named, not the TPE-only key
    pytest.param(
        {
            **SEARCH,
            "objective": [{"metric": "val_token_accuracy", "mode": "max"}, {"metric": "latent_share", "mode": "min"}],
            "sampler": {"tpye": "tpe", "constant_liar": True},
        },
        "unknown key 'tpye' in sampler",
        id="misspelt-sampler-type",
    ),
    pytest.param(
        {
            **SEARCH,
            "search": {"model.d_model": {"type": "categorical", "choices": [32, 64]}},
            "sampler": {"type": "gp"},
        },
        "sampler.type='gp' models numeric spaces only; this one is not (model.d_model is categorical)",
        id="gp-with-categorical",
    ),
    pytest.param(
        {**SEARCH, "sampler": {"type": "tpe", "n_startup_trials": -1}},
        "sampler.n_startup_trials=-1 must be greater than or equal to 0",
        id="negative-startup",
    ),
    pytest.param(
        {**GOOD, "config": {"data": {"input_len": 32, "test_fraction": 0.8}}},
        "data.test_fraction=0.8 must be in [0, 1 - data.val_fraction=0.2)",
        id="test-fraction-too-large",
    ),
    pytest.param(
        {**GOOD, "search": {"train.repeats": {"type": "int", "low": 1, "high": 3}}},
        "search.train.repeats: the number of seeds is how a trial is measured",
        id="searched-repeats",
    ),
    pytest.param({**GOOD, "config": {"train": {"repeats": 0}}}, "train.repeats=0 must be positive", id="no-repeats"),
    pytest.param(
        {**GOOD, "constraints": [{"metric": "val_tokn_accuracy", "at_least": 0.9}]},
        "constraints[0]: metric='val_tokn_accuracy' is not reported by the trainer",
        id="constraint-unknown-metric",
    ),
    pytest.param(
        {**GOOD, "constraints": [{"metric": "test_token_accuracy", "at_least": 0.9}]},
        "constraints[0]: metric='test_token_accuracy' is measured on the test pages",
        id="constraint-on-test",
    ),
    pytest.param(
        {**GOOD, "constraints": [{"metric": "val_loss", "at_least": 0.1, "at_most": 2.0}]},
        "the constraint on val_loss needs exactly one of at_least or at_most",
        id="constraint-two-bounds",
    ),
    pytest.param(
        {**GOOD, "constraints": [{"metric": "val_loss", "at_most": 2.0}], "sampler": {"type": "random"}},
        "constraints need a sampler that models them",
        id="constraint-random-sampler",
    ),
]
LIMITS = [
    pytest.param(
        {**GOOD, "trials": {"total": 100_000_000}},
        "trials.total=100,000,000 is above seqae's limit of 10,000",
        id="too-many-trials",
    ),
    pytest.param(
        {**GOOD, "trials": {"per_cell": 6000}},
        "trials.per_cell=6,000 x 2 grid cells = 12,000 trials is above seqae's limit of 10,000",
        id="too-many-per-cell",
    ),
    pytest.param(
        {**GOOD, "grid": {"data.input_len": list(range(8, 208)), "model.d_model": list(range(8, 68))}},
        "grid with 12,000 cells is above seqae's limit of 10,000",
        id="too-many-cells",
    ),
    pytest.param(
        {**GOOD, "max_concurrent": 5000},
        "max_concurrent=5,000 is above seqae's limit of 1,000",
        id="too-much-concurrency",
    ),
]


@pytest.mark.parametrize("doc, message", BAD + LIMITS)
def test_bad_sweep_files_are_rejected_naming_file_and_key(tmp_path, doc, message):
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError) as error:
        spec_lib.load(path)
    assert message in str(error.value)
    assert str(path) in str(error.value)


def test_yaml_bomb_and_huge_files_are_refused(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)
    )
    with pytest.raises(ConfigError, match="aliases are not allowed"):
        spec_lib.load(write(tmp_path, bomb, "bomb.yaml"))
    huge = write(tmp_path, "description: " + "x" * (3 * 1024 * 1024), "huge.yaml")
    with pytest.raises(ConfigError, match="too large for a sweep file"):
        spec_lib.load(huge)


@pytest.mark.parametrize("doc, message", BAD + LIMITS)
def test_cli_refuses_bad_files_with_exit_2_and_creates_nothing(tmp_path, doc, message, capsys):
    path = write(tmp_path, doc)
    workspace = tmp_path / "ws"
    code = main(["sweep", "run", str(path), "--workspace", str(workspace)])
    # no workspace entry, so no MLflow experiment and no Optuna study either
    assert_refused(code, capsys.readouterr().err, message, created=(workspace,))


PROFILED = {
    **GOOD,
    "profiles": {
        "laptop": {
            "description": "small",
            "data.input_len": 16,
            "grid.model.latent_fraction": [0.5],
            "trials.per_cell": 1,
        }
    },
}


def test_a_profile_applies_its_overrides_before_any_set(tmp_path):
    path = write(tmp_path, PROFILED)
    plain = spec_lib.load(path)
    assert plain.profile is None and plain.base["data.input_len"] == 32 and plain.planned_trials() == 4
    laptop = spec_lib.load(path, ["profile=laptop", "trials.per_cell=3"])
    assert laptop.profile == "laptop" and laptop.base["data.input_len"] == 16
    assert laptop.grid == {"model.latent_fraction": (0.5,)} and laptop.planned_trials() == 3  # the --set wins
    assert laptop.description.endswith("[profile laptop: small]")
    assert spec_lib.parse(laptop.to_dict(), str(path)) == laptop  # the stored form keeps the profile
    assert spec_lib.diff(plain, laptop)  # resuming with another profile is a change


@pytest.mark.parametrize(
    "doc, sets, message",
    [
        pytest.param(
            PROFILED,
            ["profile=desktop"],
            "profile='desktop' is not defined; this file's profiles: laptop",
            id="unknown-profile",
        ),
        pytest.param(
            GOOD, ["profile=laptop"], "profile='laptop' is not defined; this file's profiles: none", id="no-profiles"
        ),
        pytest.param(
            {**GOOD, "profiles": {"laptop": {"model.d_attn": 100, "model.heads": 3}}},
            [],
            "model.d_attn=100 must be divisible by model.heads=3",
            id="a-broken-profile-fails-any-load",
        ),
        pytest.param(
            {**GOOD, "profiles": {"laptop": ["data.input_len=16"]}},
            [],
            "profiles.laptop must be a mapping",
            id="not-a-mapping",
        ),
    ],
)
def test_bad_profiles_are_named(tmp_path, doc, sets, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        spec_lib.load(write(tmp_path, doc), sets)


def test_starting_points_conditions_and_sampler_settings_parse_and_round_trip(tmp_path):
    doc = {
        **SEARCH,
        "config": {"data": {"input_len": 32, "test_fraction": 0.1}, "model": {"block": "transformer"}},
        "search": {
            "model.block": {"type": "categorical", "choices": ["paper", "transformer"]},
            "model.heads": {"type": "categorical", "choices": [2, 8], "when": {"model.block": "transformer"}},
            "model.residual": {"type": "categorical", "choices": [False, True], "when": {"model.block": ["paper"]}},
            "train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
        },
        "start": {"paper": {"model": {"block": "paper", "residual": True}, "train.lr": 1e-3}, "defaults": {}},
        "sampler": {"type": "tpe", "n_startup_trials": 2},
    }
    spec = spec_lib.load(write(tmp_path, doc))
    assert spec.search["model.heads"].when == {"model.block": ("transformer",)}
    assert spec.start_params("paper") == {"model.block": "paper", "model.residual": True, "train.lr": 1e-3}
    assert spec.start_params("defaults") == {"model.block": "transformer", "model.heads": 8, "train.lr": 2e-3}
    assert spec.sampler.model_dump() == {
        "type": "tpe",
        "seed": 0,
        "n_startup_trials": 2,
        "multivariate": True,
        "group": True,
        "constant_liar": True,
    }
    again = spec_lib.parse(spec.to_dict(), "stored")
    assert again.to_dict() == spec.to_dict() and spec_lib.diff(spec, again) == ""
    assert spec.notes() == []


# Between them these sweeps set every field of every part of a sweep file to something other than
# its default (a grid and starting points cannot go together, nor trials.total and per_cell).
EVERY_FIELD = [
    {
        "description": "a grid",
        "config": {"data": {"input_len": 32}, "model": {"block": "transformer"}},
        "grid": {"model.latent_fraction,train.seed": [[0.5, 1], [0.25, 2]]},
        "search": {
            "train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
            "model.layers": {"type": "int", "low": 1, "high": 4, "step": 1, "log": True},
            "model.heads": {"type": "categorical", "choices": [2, 4], "when": {"train.seed": [2]}},
        },
        "objective": {"metric": "val_token_accuracy", "mode": "max", "target": 0.99},
        "trials": {"per_cell": 2},
        "constraints": [{"metric": "val_loss", "at_most": 2.0}],
        "sampler": {
            "type": "tpe",
            "seed": 7,
            "n_startup_trials": 3,
            "multivariate": False,
            "group": False,
            "constant_liar": False,
        },
        "scheduler": {"type": "asha", "grace_period": 2, "reduction_factor": 3},
        "resources": {"cpu": 2, "gpu": 0.5, "fuse": 2},
        "max_concurrent": 3,
        "priority": 2,
        "weight": 2.5,
        "retries": 2,
        "budget": {"gpu_hours": 1.5},
        "checkpoints": {"keep_best": 2},
        "notify": {"urls": ["env:SEQAE_TEST_NOTIFY", "file:/etc/seqae/notify-url"], "events": ["best", "end"]},
        "profiles": {"small": {"description": "fewer trials", "trials.per_cell": 1}},
    },
    {
        **SEARCH,
        "search": {"train.lr": {"type": "uniform", "low": 1e-4, "high": 1e-2}},
        "start": {"paper": {"train.lr": 1e-3}},
        "budget": {"cpu_hours": 0.5},
        "warm_start": {"from": ["earlier"], "top": 2},
        "constraints": [{"metric": "latent_share", "at_least": 0.1}],
    },
]


def _parts(model: type[BaseModel]) -> set[type[BaseModel]]:
    """``model`` and every model its fields hold, however nested (in a tuple, a dict, an Optional)."""
    parts, pending = {model}, [model]
    while pending:
        for field in pending.pop().model_fields.values():
            stack: list[object] = [field.annotation]
            while stack:
                annotation = stack.pop()
                if isinstance(annotation, type) and issubclass(annotation, BaseModel) and annotation not in parts:
                    parts.add(annotation)
                    pending.append(annotation)
                stack.extend(typing.get_args(annotation))
    return parts


def _set_fields(model: BaseModel) -> set[tuple[str, str]]:
    """(part, field) of each field that ``model`` and the models inside it hold at a non-default value."""
    found = set()
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if value != field.get_default(call_default_factory=True):
            found.add((type(model).__name__, name))
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, tuple) else [value]
        for item in inner:
            if isinstance(item, BaseModel):
                found |= _set_fields(item)
    return found


def test_the_stored_form_keeps_every_field_of_the_schema(tmp_path):
    """What `resume` reads back is what ran: each field of the schema, found from the models
    themselves (a field added later is checked without touching this test), survives the stored
    form, through JSON as sweep.json holds it."""
    wanted = {(part.__name__, name) for part in _parts(spec_lib.SweepSpec) for name in part.model_fields}
    wanted -= {("SweepSpec", "profiles")}  # applied, then dropped: the sweep is what they were applied to
    specs = [
        spec_lib.load(write(tmp_path, doc, f"every-{n}.yaml"), ["profile=small"] if "profiles" in doc else [])
        for n, doc in enumerate(EVERY_FIELD)
    ]
    assert wanted - set().union(*map(_set_fields, specs)) == set()
    for spec in specs:
        stored = json.loads(json.dumps(spec.to_dict()))
        again = spec_lib.parse(stored, spec.source)
        assert again == spec and _set_fields(again) == _set_fields(spec)
        assert spec_lib.diff(spec, again) == "" and again.fingerprint() == spec.fingerprint()


@pytest.mark.parametrize(
    "sets, note",
    [
        pytest.param(
            ["trials.total=6"],
            "6 trials, 10 random start-up trials (sampler.n_startup_trials): this is a random "
            "search, TPE proposes no trial",
            id="random-search",
        ),
        pytest.param(
            ["trials.total=12", "data.test_fraction=0"], "no test split (data.test_fraction is 0)", id="no-test"
        ),
        pytest.param(
            ["trials.total=12", "train.epochs=3", "scheduler={type: asha, grace_period: 1, reduction_factor: 3}"],
            "ASHA decides once, at epoch 1 of 3 (scheduler.grace_period 1, reduction_factor 3): a trial is stopped "
            "at most once; train.epochs above 3 gives it a second rung",
            id="asha-once",
        ),
        pytest.param(
            ["trials.total=12", "train.epochs=2", "scheduler={type: asha, grace_period: 2, reduction_factor: 2}"],
            "ASHA decides never of 2",
            id="asha-never",
        ),
        pytest.param(
            ["trials.total=12", "train.epochs=4", "scheduler={type: asha, grace_period: 0.25, reduction_factor: 2}"],
            "ASHA's rungs at 0.25, 0.5 epochs decide nothing for trials that validate once an epoch: set "
            "train.validate_every to validate at least every 0.25 epoch",
            id="asha-below-an-epoch-once-an-epoch",
        ),
    ],
)
def test_a_valid_sweep_that_cannot_do_what_it_says_is_told_so(tmp_path, sets, note):
    spec = spec_lib.load(write(tmp_path, {**SEARCH, "config": {"data": {"input_len": 32, "test_fraction": 0.1}}}), sets)
    assert [n for n in spec.notes() if note in n], spec.notes()
    assert len(spec.notes()) == 1


def test_a_pinned_key_holds_for_the_starting_points_too(tmp_path):
    doc = {
        **SEARCH,
        "search": {**SEARCH["search"], "model.d_model": {"type": "categorical", "choices": [32, 64]}},
        "start": {"wide": {"model": {"d_model": 64}, "train.lr": 1e-3}},
    }
    spec = spec_lib.load(write(tmp_path, doc), ["model.d_model=16"])
    assert spec.start == {"wide": {"train.lr": 1e-3}} and spec.base["model.d_model"] == 16
    assert spec.start_params("wide") == {"train.lr": 1e-3}
