"""`python -m research.search_vs_recipe`'s table (research/search_vs_recipe.py) on synthetic outcomes with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

from research.search_vs_recipe import (
    BUDGET_TRAININGS,
    FRACTIONS,
    GPU,
    LAPTOP,
    Scores,
    Search,
    _search,
    _trained,
    equal_compute_seeds,
    figure,
    outputs,
    run,
    summarize,
)
from seqae_errors import ConfigError
from sweeps.spec import sweep as spec_lib

SEED_EFFECT = (-0.02, 0.0, 0.03)  # what each training seed does to every configuration


def scores(level: float, val_above: float = 0.01, cost_seconds: float = 60.0) -> Scores:
    test = tuple(level + e for e in SEED_EFFECT)
    return Scores(tuple(t + val_above for t in test), test, cost_seconds)


def search(
    arm: str,
    fraction: float,
    seed: int,
    level: float,
    is_recipe: bool = False,
    returned: float = 0.8,
    spent: float = 350.0,
) -> Search:
    config = {} if is_recipe else {"model.block": "transformer", "train.lr": 0.00234, "model.dropout": 0.1234}
    return Search(
        arm,
        fraction,
        seed,
        best_val=level + 0.05,
        returned_test=returned,
        config=config,
        is_recipe=is_recipe,
        trials=9,
        cost_seconds=spent,
        budget_seconds=360.0,
        scores=scores(level),
    )


def kept_of(values: list[float]) -> Scores:
    """recipe@k replicate whose kept model (the best validation) scores ``values[-1]`` on test."""
    return Scores(tuple(range(len(values))), tuple(values), 60.0, tuple(range(len(values))))


def test_the_table_pairs_gains_by_training_seed_and_tests_over_search_seeds():
    """The recipe scores 0.80 (+ each seed's effect) at every fraction. tpe+asha's ten searches at
    25% beat it by 4 points at every training seed (no spread once paired: a zero-width t
    interval, and the exact sign-flip p of ten positive seeds, 2^-10); at 50% one of three chose
    the recipe itself; random is 1 point worse everywhere; random+asha, at 25% only, 3 points
    better: each pair of arms is compared where both ran."""
    recipe = {f: scores(0.80) for f in (0.5, 0.25)}
    searches = (
        [search("tpe+asha", 0.25, s, 0.84, spent=370.0) for s in range(10, 20)]
        + [
            search("tpe+asha", 0.5, 0, 0.80, is_recipe=True),
            search("tpe+asha", 0.5, 1, 0.82),
            search("tpe+asha", 0.5, 2, 0.82),
        ]
        + [search("random", 0.5, s, 0.79) for s in (0, 1, 2)]
        + [search("random", 0.25, s, 0.79) for s in range(10, 20)]
        + [search("random+asha", 0.25, s, 0.83) for s in range(10, 20)]
    )
    rows = {(r["latent"], r["arm"]): r for r in summarize(recipe, {}, searches)}

    assert rows[("32->16", "recipe")]["test_mean"] == pytest.approx(0.8033, abs=1e-4)
    assert rows[("32->16", "recipe")]["val_to_test_drop"] == pytest.approx(0.01)
    assert rows[("32->16", "recipe")]["cpu_s"] == 180

    at_25 = rows[("32->8", "tpe+asha")]
    assert at_25["gain_points"] == pytest.approx(4.0) and at_25["gain_95ci_t"] == "[+4.00, +4.00]"
    assert at_25["p_sign_flip"] == pytest.approx(round(2**-10, 4)) and at_25["search_seeds"] == 10
    assert at_25["wins"] == "10/10" and at_25["budget_cpu_s"] == 360 and at_25["cpu_s"] == 370
    assert at_25["overshoot_cpu_s_max"] == 10.0  # what it spent past its budget, counted
    assert at_25["val_to_test_drop"] == pytest.approx(0.05 - 0.0033, abs=1e-4)  # chosen by its own val: biased up
    assert at_25["chosen"].split(" | ")[0] == "block=transformer dropout=0.123 lr=2.3e-03"

    at_50 = rows[("32->16", "tpe+asha")]
    assert at_50["gain_points"] == pytest.approx(4 / 3, abs=0.005) and at_50["wins"] == "2/3"
    assert at_50["chosen"].startswith("recipe | ")
    low, high = (float(x) for x in at_50["gain_95ci_t"].strip("[]").split(", "))
    assert low < 0 < high  # 0, 2, 2 points over 3 search seeds: the t interval reaches below 0
    assert at_50["p_sign_flip"] == pytest.approx(0.25)  # flips of the two positive seeds only
    assert at_50["p_holm"] == pytest.approx(0.25)  # Holm over the two fractions: the larger p, times 1
    low_joint, high_joint = (float(x) for x in at_50["gain_ci_2_claims"].strip("[]").split(", "))
    assert low_joint < low and high_joint > high  # simultaneous: wider

    for latent in ("32->16", "32->8"):
        assert rows[(latent, "random")]["gain_points"] == pytest.approx(-1.0)
        assert rows[(latent, "random")]["p_holm"] == 1.0
    contrast = rows[("32->8", "tpe+asha - random")]
    assert contrast["gain_points"] == pytest.approx(5.0) and contrast["p_holm"] == pytest.approx(2 * 2**-10, abs=1e-4)
    same_scheduler, asha = rows[("32->8", "tpe+asha - random+asha")], rows[("32->8", "random+asha - random")]
    assert same_scheduler["gain_points"] == pytest.approx(1.0) and asha["gain_points"] == pytest.approx(4.0)
    assert asha["p_holm"] == pytest.approx(2**-10, abs=1e-4)  # measured at one fraction: a family of one
    assert ("32->16", "random+asha - random") not in rows and ("32->16", "random+asha") not in rows


def test_recipe_at_equal_compute_keeps_the_best_of_k_by_validation_and_pairs_replicates():
    assert len(equal_compute_seeds(0)) == BUDGET_TRAININGS
    assert not set(equal_compute_seeds(0)) & set(equal_compute_seeds(1))  # disjoint replicates
    recipe = {0.25: scores(0.80)}
    equal = {0.25: [kept_of([0.70, 0.75, 0.81]), kept_of([0.70, 0.79]), kept_of([0.82])]}
    searches = [search("tpe+asha", 0.25, s, 0.84, returned=r) for s, r in zip(range(3), (0.86, 0.84, 0.85))]
    rows = {(r["latent"], r["arm"]): r for r in summarize(recipe, equal, searches)}
    assert rows[("32->8", f"recipe@{BUDGET_TRAININGS}")]["test_mean"] == pytest.approx(
        np.mean([0.81, 0.79, 0.82]), abs=1e-4
    )
    returned = rows[("32->8", f"tpe+asha - recipe@{BUDGET_TRAININGS} (returned model)")]
    assert returned["gain_points"] == pytest.approx(100 * np.mean([0.05, 0.05, 0.03]), abs=0.01)


def test_the_figure_draws_every_arm(tmp_path):
    recipe = {0.25: scores(0.8)}
    path = figure(recipe, [search("random", 0.25, 0, 0.79), search("tpe+asha", 0.25, 0, 0.84)], tmp_path / "f.png")
    assert path.stat().st_size > 10_000


def test_one_fraction_at_a_time_keeps_the_other_fractions_files_and_an_unknown_fraction_is_refused(tmp_path):
    every, quarter = outputs(FRACTIONS), outputs((0.25,))
    assert every["table"].name == "search-vs-recipe.csv" and quarter["table"].name == "search-vs-recipe-0250.csv"
    assert not {p.name for p in every.values()} & {p.name for p in quarter.values()}
    with pytest.raises(ConfigError, match=r"--fraction 0.3 is not one of search's latent fractions"):
        run("unused", tmp_path / "ws", (0.3,))
    assert not (tmp_path / "ws").exists()  # refused before anything was created


def test_the_gpu_profile_runs_the_papers_length_and_widths_in_eighths_of_a_gpu_and_pays_in_gpu_seconds(tmp_path):
    """The search's GPU profile's sweeps are valid sweep files: 512 -> 128 tokens, the paper's widths,
    an eighth of a GPU per trial, its budget in GPU-hours; its files are not the laptop's."""
    searched = spec_lib.parse(_search("data", "tpe+asha", 0.25, 0, 90.0, GPU), "search-gpu")
    assert (searched.resources.gpu, searched.max_concurrent, searched.budget.unit) == (0.125, 8, "gpu")
    assert searched.budget.hours == pytest.approx(90.0 / 3600)
    base = searched.base
    assert (base["data.input_len"], base["data.max_pages"], base["model.latent_fraction"]) == (512, None, 0.25)
    recipe = spec_lib.parse(_trained("data", GPU.recipe, [(0.25, 1)], GPU), "search-gpu recipe")
    assert (recipe.base["model.d_model"], recipe.base["model.d_attn"]) == (256, 512)
    laptop = spec_lib.parse(_search("data", "random", 0.25, 0, 90.0, LAPTOP), "search")
    assert (laptop.resources.gpu, laptop.budget.unit, laptop.base["data.input_len"]) == (0, "cpu", 32)
    assert not {p.name for p in outputs((0.25,), GPU).values()} & {p.name for p in outputs((0.25,)).values()}
    with pytest.raises(ConfigError, match=r"--fraction 0.5 is not one of search-gpu's latent fractions \(0.25\)"):
        run("unused", tmp_path / "ws", (0.5,), GPU)


@pytest.mark.parametrize(
    "sessions, is_ended",
    [
        pytest.param([], False, id="never-run"),
        pytest.param([{"outcome": "interrupted", "trials": {"COMPLETE": 1, "RUNNING": 1}}], False, id="interrupted"),
        pytest.param([{"outcome": "stopped", "trials": {"COMPLETE": 1, "RUNNING": 1}}], False, id="stopped-now"),
        pytest.param([{"outcome": "stopped", "trials": {"COMPLETE": 4}}], True, id="budget-spent"),
        pytest.param(
            [{"outcome": "interrupted"}, {"outcome": "complete", "trials": {"COMPLETE": 5}}], True, id="complete"
        ),
    ],
)
def test_a_search_that_ended_is_read_back_and_one_left_to_continue_is_resumed(tmp_path, sessions, is_ended):
    """A rerun of `python -m research.search_vs_recipe` resumes only what an earlier run left unfinished: resumed, an
    ended search would lift its budget's stop and could add a trial, moving the published table."""
    from research.sweep_runs import ended
    from sweeps.stores.workspace import SessionRecord, Workspace
    from tests.test_status import quickstart, write_sweep

    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "optuna.db").touch()  # where the record says the study is: only the record is read
    workspace = Workspace(tmp_path / "ws")
    assert not ended(workspace, "search")
    write_sweep(
        workspace,
        "search",
        quickstart(),
        [SessionRecord.of_dict({"started": 0.0, "pid": 1, "host": "h", **s}) for s in sessions],
    )
    assert ended(workspace, "search") is is_ended
