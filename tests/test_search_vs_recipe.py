"""`seqae bench search`'s table (benchmarks/search_vs_recipe.py) on synthetic outcomes with a known answer."""

from __future__ import annotations

import pytest

from benchmarks.search_vs_recipe import Scores, Search, figure, summarize

SEED_EFFECT = (-0.02, 0.0, 0.03)  # what each training seed does to every configuration


def scores(level: float, val_above: float = 0.01, cpu_seconds: float = 60.0) -> Scores:
    test = tuple(level + e for e in SEED_EFFECT)
    return Scores(tuple(t + val_above for t in test), test, cpu_seconds)


def search(arm: str, fraction: float, seed: int, level: float, is_recipe: bool = False) -> Search:
    config = {} if is_recipe else {"model.block": "transformer", "train.lr": 0.00234, "model.dropout": 0.1234}
    return Search(arm, fraction, seed, best_val=level + 0.05, config=config, is_recipe=is_recipe, trials=9,
                  cpu_seconds=350.0, scores=scores(level))


def test_the_table_pairs_gains_by_training_seed_and_corrects_over_the_fractions():
    """The recipe scores 0.80 (+ each seed's effect) at every fraction. tpe+asha's three searches
    beat it by 4 points at every training seed at 25% (no spread once paired), and at 50% one of
    them chose the recipe itself; random is 1 point worse everywhere."""
    recipe = {f: scores(0.80) for f in (0.5, 0.25)}
    searches = ([search("tpe+asha", 0.25, s, 0.84) for s in (10, 11, 12)]
                + [search("tpe+asha", 0.5, 0, 0.80, is_recipe=True), search("tpe+asha", 0.5, 1, 0.82),
                   search("tpe+asha", 0.5, 2, 0.82)]
                + [search("random", f, s, 0.79) for f, seeds in ((0.5, (0, 1, 2)), (0.25, (10, 11, 12))) for s in seeds])
    rows = {(r["latent"], r["arm"]): r for r in summarize(recipe, searches)}

    assert rows[("32->16", "recipe")]["test_mean"] == pytest.approx(0.8033, abs=1e-4)
    assert rows[("32->16", "recipe")]["val_to_test_drop"] == pytest.approx(0.01)
    assert rows[("32->16", "recipe")]["cpu_s"] == 180

    at_25 = rows[("32->8", "tpe+asha")]
    assert at_25["gain_points"] == pytest.approx(4.0) and at_25["gain_95ci"] == "[+4.00, +4.00]"
    assert at_25["wins"] == "3/3" and at_25["p_holm"] == 0.0
    assert at_25["val_to_test_drop"] == pytest.approx(0.05 - 0.0033, abs=1e-4)  # chosen by its own val: biased up
    assert at_25["budget_cpu_s"] == 360 and at_25["cpu_s"] == 350
    assert at_25["chosen"].split(" | ")[0] == "block=transformer dropout=0.123 lr=2.3e-03"

    at_50 = rows[("32->16", "tpe+asha")]
    assert at_50["gain_points"] == pytest.approx(4 / 3, abs=0.005) and at_50["wins"] == "2/3"
    assert at_50["chosen"].startswith("recipe | ")
    low, high = (float(x) for x in at_50["gain_95ci"].strip("[]").split(", "))
    assert low == pytest.approx(0.0) and high == pytest.approx(2.0)  # a search seed that kept the recipe gains 0

    for latent in ("32->16", "32->8"):
        assert rows[(latent, "random")]["gain_points"] == pytest.approx(-1.0) and rows[(latent, "random")]["wins"] == "0/3"
        assert rows[(latent, "random")]["p_holm"] == 1.0
    assert rows[("32->8", "tpe+asha - random")]["gain_points"] == pytest.approx(5.0)


def test_the_figure_draws_every_arm(tmp_path):
    recipe = {0.25: scores(0.8)}
    path = figure(recipe, [search("random", 0.25, 0, 0.79), search("tpe+asha", 0.25, 0, 0.84)], tmp_path / "f.png")
    assert path.stat().st_size > 10_000
