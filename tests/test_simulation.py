"""The seam for research (sweeps/running/simulation.py): a sweep file's own searcher and scheduler,
driven on recorded curves without Ray, a store or a training."""

from __future__ import annotations

import optuna
import pytest

from seqae_core.config import FREE_KEYS
from seqae_errors import ConfigError
from sweeps.running.schedulers import ParetoASHA, RacingASHA, ResumableASHA
from sweeps.running.simulation import simulate

SEARCH = {
    "train.lr": {"type": "ordered", "choices": [1e-3, 2e-3, 5e-3]},
    "model.block": {"type": "categorical", "choices": ["paper", "transformer"]},
    "model.heads": {"type": "categorical", "choices": [1, 2], "when": {"model.block": "transformer"}},
}


def document(scheduler: str = "asha", **more) -> dict:
    return {
        "config": {"train": {"epochs": 4}},
        "search": SEARCH,
        "trials": {"total": 20},
        "sampler": {"type": "random", "seed": 0},
        "scheduler": {"type": scheduler, "grace_period": 1, "reduction_factor": 2},
        **more,
    }


@pytest.mark.parametrize(
    "scheduler, kind",
    [("asha", ResumableASHA), ("hyperband", ResumableASHA), ("race", RacingASHA), ("none", type(None))],
)
def test_the_scheduler_is_the_one_the_sweep_file_names(scheduler, kind):
    simulation = simulate(document(scheduler), "replay")
    assert isinstance(simulation.rungs, kind) and simulation.epochs == 4
    assert (scheduler == "race") == isinstance(simulation.rungs, RacingASHA)


def test_two_objectives_rank_the_rungs_by_non_dominated_sorting_and_the_study_has_both_directions():
    objective = [{"metric": "val_token_accuracy", "mode": "max"}, {"metric": "latent_share", "mode": "min"}]
    simulation = simulate(document(objective=objective), "front")
    assert isinstance(simulation.rungs, ParetoASHA)
    assert simulation.study.directions == [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]


def test_asha_stops_the_trial_behind_at_its_first_rung_and_lets_the_one_ahead_go_on():
    simulation = simulate(document(), "rungs")
    for number, value in enumerate([0.9, 0.5]):
        simulation.start(number)
        stop = simulation.result(number, {"epoch": 1, "val_token_accuracy": value})
        assert stop is (number == 1)  # factor 2: the better half of the rung's two goes on
    assert simulation.result(0, {"epoch": 4, "val_token_accuracy": 0.95})  # the last epoch ends every trial


def test_a_starting_point_runs_to_the_end_whatever_its_rung():
    simulation = simulate(document("race"), "race")
    simulation.start(0)
    simulation.result(0, {"epoch": 1, "val_token_accuracy": 0.9})
    simulation.start(1, start="warm")
    assert not simulation.result(1, {"epoch": 1, "val_token_accuracy": 0.1})


def test_proposals_follow_the_space_its_conditions_and_a_packs_shape():
    simulation = simulate(document(), "packs")
    for _ in range(10):
        (proposal,) = simulation.ask()
        assert ("model.heads" in proposal.params) == (proposal.params["model.block"] == "transformer")
        assert proposal.params["train.lr"] in (1e-3, 2e-3, 5e-3)  # the level, where Optuna records its position
        assert proposal.trial.params["train.lr"] in (0, 1, 2)
        simulation.study.tell(proposal.trial, 0.5)
    pack = simulation.ask(3)
    shapes = [{k: v for k, v in p.params.items() if k not in FREE_KEYS} for p in pack]
    assert len(pack) == 3 and all(shape == shapes[0] for shape in shapes)
    assert [t.state for t in simulation.study.get_trials()[-3:]] == [optuna.trial.TrialState.RUNNING] * 3


def test_an_enqueued_configuration_is_proposed_next_as_itself():
    simulation = simulate(document(), "warm")
    chosen = {"train.lr": 5e-3, "model.block": "transformer", "model.heads": 2}
    simulation.enqueue(chosen)
    (proposal,) = simulation.ask()
    assert proposal.params == chosen and proposal.trial.params == simulation.recorded(chosen)


def test_a_mistake_in_the_document_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="scheduler"):
        simulate(document("sometimes"), "replay of a typo")
