"""The paper's claims on synthetic sweeps whose answer is known."""

from __future__ import annotations

import pytest

from dashboards import claims
from sweeps.spec import sweep as spec_lib
from tests.sweep_helpers import STUDIES

# Fig. 3 as the paper draws it: near-perfect at 50%, falling with the fraction, short inputs worst.
PAPER_LIKE = {
    16: [(100.0, 1.0), (50.0, 0.975), (25.0, 0.60), (12.5, 0.30)],
    64: [(100.0, 1.0), (50.0, 0.99), (25.0, 0.80), (12.5, 0.50)],
    512: [(100.0, 1.0), (50.0, 1.0), (25.0, 0.90), (12.5, 0.70)],
}
# Not monotone (64 rises from 50% to 25%), below 0.97 at 50% for 64, long inputs worse at 25%.
BROKEN = {
    16: [(100.0, 1.0), (50.0, 0.98), (25.0, 0.95)],
    64: [(100.0, 0.99), (50.0, 0.80), (25.0, 0.90)],
}


def test_a_paper_like_sweep_reproduces_c1_to_c3():
    verdicts = {v.claim: v for v in claims.check(PAPER_LIKE, {})}
    assert [verdicts[c].verdict for c in ("C1", "C2", "C3")] == [claims.REPRODUCED] * 3
    assert "16: 0.9750" in verdicts["C1"].measured and "512: 1.0000" in verdicts["C1"].measured
    assert "12.5%: 16: 0.3000, 64: 0.5000, 512: 0.7000 (rises with length)" in verdicts["C3"].measured
    assert verdicts["C4"].verdict == claims.NO_DATA


def test_a_non_monotone_sweep_is_not_reproduced_and_says_where():
    verdicts = {v.claim: v for v in claims.check(BROKEN, {})}
    assert verdicts["C1"].verdict == claims.NOT_REPRODUCED and "64: 0.8000" in verdicts["C1"].measured
    assert verdicts["C2"].verdict == claims.NOT_REPRODUCED
    assert verdicts["C2"].measured == "rises where it should fall: 64: 0.8000 at 50% -> 0.9000 at 25%"
    assert verdicts["C3"].verdict == claims.NOT_REPRODUCED and "(does not rise with length)" in verdicts["C3"].measured


def test_noise_below_the_tolerance_is_no_rise():
    flat = {32: [(100.0, 0.99), (50.0, 0.985), (25.0, 0.988)]}
    assert claims.monotone_in_fraction(flat).verdict == claims.REPRODUCED
    assert claims.monotone_in_fraction(flat, tolerance=0.0).verdict == claims.NOT_REPRODUCED


def test_claims_without_their_data_say_so():
    verdicts = claims.check({32: [(75.0, 0.99)]}, {})
    assert [v.verdict for v in verdicts] == [claims.NO_DATA] * 4


def test_seed_spread_wider_for_short_inputs_and_narrowed_by_warm_start():
    spreads = {
        (32, 16, "static"): [0.50, 0.70, 0.90],
        (32, 16, "warm"): [0.88, 0.90, 0.92],
        (128, 64, "static"): [0.80, 0.85, 0.90],
        (128, 64, "warm"): [0.89, 0.90, 0.91],
    }
    verdict = claims.seed_spread(spreads)
    assert verdict.verdict == claims.REPRODUCED, verdict
    assert verdict.measured.startswith("32->16: sd 0.2000 static, 0.0200 warm")
    spreads[(32, 16, "warm")] = [0.40, 0.70, 0.99]  # the warm start widens the short input's spread
    assert claims.seed_spread(spreads).verdict == claims.NOT_REPRODUCED


def test_the_grid_table_labels_each_variant_by_what_it_changes():
    from dashboards.report.data import Trial
    from dashboards.report.groups import grid_data

    grid = {"model.latent_len": [16, 8], "train.lr,model.residual": [[1e-3, False], [1e-3, True]]}
    trials = []
    for number, (latent, residual, acc) in enumerate(
        [(16, False, 0.16), (16, True, 0.97), (8, False, 0.12), (8, True, 0.90)]
    ):
        trial = Trial(
            number,
            f"run{number}",
            "FINISHED",
            "COMPLETE",
            {"model.latent_len": latent, "train.lr": 1e-3, "model.residual": residual},
        )
        trial.curves["val_token_accuracy"] = [(1, acc / 2), (2, acc)]
        trials.append(trial)
    table = grid_data(trials, grid)
    assert table == {
        "caption": "best val_token_accuracy; columns: model.latent_len",
        "cols": ["16", "8"],
        "rows": [
            {"label": "lr=0.001, residual=False", "cells": ["0.1600", "0.1200"]},
            {"label": "residual=True", "cells": ["0.9700", "0.9000"]},
        ],
    }
    assert grid_data(trials, {"model.latent_len": [16, 8]}) is None  # one axis: no table


def test_seed_spread_says_which_half_of_the_claim_fails():
    spreads = {
        (16, 8, "static"): [0.91, 0.92],
        (16, 8, "warm"): [0.97, 0.971],
        (128, 72, "static"): [0.85, 0.87],
        (128, 72, "warm"): [0.95, 0.955],
    }
    verdict = claims.seed_spread(spreads)
    assert verdict.verdict == claims.NOT_REPRODUCED
    assert verdict.measured.endswith(
        "The static spread does not shrink with the input length; the warm start narrows it at every setting"
    )


@pytest.mark.parametrize(
    "study, profile, untested",
    [
        pytest.param("quickstart.yaml", None, {"C1", "C2", "C3", "C4"}, id="a-search-tests-none"),
        pytest.param("paper_fig3.yaml", "laptop", {"C4"}, id="fig3-tests-c1-to-c3"),
        pytest.param("paper_fig2.yaml", None, {"C3", "C4"}, id="fig2-has-one-input-length"),
        pytest.param("paper_seeds.yaml", None, {"C1", "C2", "C3"}, id="seeds-vary-the-schedule"),
        pytest.param("ablation_paper_block.yaml", None, {"C1", "C2", "C3", "C4"}, id="the-ablation-varies-the-block"),
    ],
)
def test_a_claim_is_checked_only_on_a_sweep_that_studies_it(study, profile, untested):
    reasons = claims.not_studied(spec_lib.load(STUDIES / study, [f"profile={profile}"] if profile else []))
    assert set(reasons) == untested
    verdicts = {v.claim: v for v in claims.check(PAPER_LIKE, {}, reasons)}
    for claim in untested:
        assert verdicts[claim].verdict == claims.NOT_TESTED
        assert verdicts[claim].measured == f"this sweep does not test it: {reasons[claim]}"
    assert all(verdicts[c].verdict == claims.REPRODUCED for c in {"C1", "C2", "C3"} - untested)


def test_the_quickstart_says_why_it_tests_no_claim():
    reasons = claims.not_studied(spec_lib.load(STUDIES / "quickstart.yaml"))
    assert (
        reasons["C1"]
        == "it searches model.d_attn, model.d_model, train.lr, so the configuration differs between trials"
    )


def test_claims_are_checked_on_the_test_scores_of_complete_grid_cells():
    from dashboards.report.data import Trial
    from dashboards.report.groups import seed_spreads, test_points
    from sweeps.results.trials import Trial as Stored

    def trial(number, latent, seed, val, test, state="complete", start=""):
        # the stores' record holds the kept checkpoint's test score; its run's last epoch scored another
        record = Stored(
            number,
            start,
            state.upper(),
            state,
            "grid",
            "",
            {},
            {"val_token_accuracy": val},
            1,
            2,
            {"val_token_accuracy": val, "test_token_accuracy": test},
            None,
            None,
            None,
            None,
            1.0,
            "",
            "",
            1,
        )
        t = Trial(
            number,
            f"run{number}",
            "FINISHED",
            state,
            {"data.input_len": 32, "model.latent_len": latent, "train.seed": seed, "train.lr": 1e-3},
            record=record,
        )
        t.curves["val_token_accuracy"] = [(1, val), (2, val / 2)]
        t.curves["test_token_accuracy"] = [(1, test), (2, test / 2)]
        return t

    trials = [
        trial(0, 16, 0, 0.99, 0.95),
        trial(1, 16, 1, 0.99, 0.93),
        trial(2, 8, 0, 0.90, 0.80),
        trial(3, 8, 1, 0.95, 0.10, state="pruned"),
        trial(4, 8, 2, 0.97, 0.20, start="recipe"),
    ]
    assert test_points(trials) == {32: [(25.0, 0.80), (50.0, 0.94)]}
    assert seed_spreads(trials) == {(32, 16, "warm"): [0.95, 0.93]}
