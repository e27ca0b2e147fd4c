"""The sweep's Optuna study as its drivers open it."""

from __future__ import annotations

import pytest
import yaml

from sweeps.spec import sweep as spec_lib
from sweeps.stores.search import open_study
from tests.sweep_helpers import STUDIES


@pytest.mark.parametrize("sampler", ["tpe", "random", "nsga2"])
def test_a_resumed_driver_proposes_new_parameters_and_a_new_sweep_the_seeded_ones(tmp_path, sampler):
    """Optuna keeps no sampler state in the storage: a resumed driver whose sampler had the sweep's
    seed would propose the first trials' parameters again (TPE's first ten are its random draws)."""
    spec = spec_lib.load(STUDIES / "quickstart.yaml", [f"sampler={{type: {sampler}, seed: 0}}", "trials.total=6"])

    def proposals(name: str, drivers: int) -> list[dict]:
        url = f"sqlite:///{tmp_path}/{name}.db"
        for _ in range(drivers):  # each driver runs its share of the trials and dies, as after a SIGKILL
            study = open_study(spec, url, name, 6, "fingerprint")
            for _ in range(6 // drivers):
                study.study.tell(study.next_trial().number, 0.5)
        return [t.params for t in study.trials()]

    resumed = proposals("resumed", drivers=3)
    assert len({tuple(sorted(p.items())) for p in resumed}) == 6, resumed
    assert proposals("again", drivers=1)[:2] == proposals("once", drivers=1)[:2]  # a sweep's seed still holds
    assert resumed[:2] == proposals("first", drivers=1)[:2]  # the first driver is the sweep as it would run alone


def _spec(tmp_path, doc: dict, *sets: str) -> spec_lib.SweepSpec:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return spec_lib.load(path, list(sets))


CONDITIONAL = {
    "config": {"data": {"input_len": 16}, "model": {"block": "transformer", "d_model": 32, "d_attn": 32}},
    "search": {
        "model.block": {"type": "categorical", "choices": ["paper", "transformer"]},
        "model.heads": {"type": "categorical", "choices": [2, 8], "when": {"model.block": "transformer"}},
        "model.residual": {"type": "categorical", "choices": [False, True], "when": {"model.block": "paper"}},
        "train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
    },
    "start": {
        "paper": {"model.block": "paper", "model.residual": True, "train.lr": 1e-3, "train.lr_schedule": "linear"},
        "defaults": {},
    },
    "trials": {"total": 12},
    "sampler": {"type": "tpe", "seed": 3, "n_startup_trials": 4},
}


def test_starting_points_run_first_by_name_then_random_start_up_then_tpe(tmp_path):
    spec = _spec(tmp_path, CONDITIONAL)
    study = open_study(spec, f"sqlite:///{tmp_path}/s.db", "s", 12, "fingerprint")
    assert study.study.metric_names == ["val_token_accuracy"]  # how optuna-dashboard labels the objective
    issued = []
    for _ in range(12):
        trial = study.next_trial()
        study.study.tell(trial.number, 0.5 + 0.01 * trial.number)
        issued.append(trial)
    paper, defaults = issued[:2]
    assert (paper.start, defaults.start) == ("paper", "defaults") and all(t.start is None for t in issued[2:])
    assert paper.params == {"model.block": "paper", "model.residual": True, "train.lr": 1e-3}
    assert paper.config.train.lr_schedule == "linear"  # a starting point's keys the search does not sample
    assert defaults.params == {"model.block": "transformer", "model.heads": 8, "train.lr": 2e-3}
    # Optuna's start-up rule: random until 4 trials finished (both starting points count), TPE after.
    assert study.proposals() == {"start": 2, "random start-up": 2, "tpe": 8}
    # define-by-run: each block's own keys only
    for trial in issued:
        block = trial.params["model.block"]
        assert ("model.heads" in trial.params) == (block == "transformer") and ("model.residual" in trial.params) == (
            block == "paper"
        )


def test_a_starting_point_enqueued_by_a_driver_that_died_runs_under_its_name(tmp_path):
    spec = _spec(tmp_path, CONDITIONAL)
    url = f"sqlite:///{tmp_path}/s.db"
    study = open_study(spec, url, "s", 12, "fingerprint")
    study.study.enqueue_trial(spec.start_params("paper"), user_attrs={"seqae.start": "paper"})  # then the driver dies

    resumed = open_study(spec, url, "s", 12, "fingerprint")
    assert resumed.start_waiting() == [0]
    trial = resumed.next_trial()
    assert (trial.number, trial.start, trial.continued) == (0, "paper", True)
    assert trial.config.model.residual is True and trial.config.train.lr_schedule == "linear"
    resumed.study.tell(0, 0.9)
    following = resumed.next_trial()
    assert (following.number, following.start) == (1, "defaults")  # paper is not tried twice


def test_a_trial_asked_by_a_driver_that_died_before_its_parameters_gets_them_when_continued(tmp_path):
    """A driver killed between Optuna's ask (the trial exists, RUNNING, with no parameters) and its
    suggestions: the next driver samples them, as the dead one would have, and records who proposed
    them, instead of training the base config's values under a trial that names none (the chaos
    soak found it: a COMPLETE trial without ``train.lr``)."""
    spec = _spec(tmp_path, CONDITIONAL)
    url = f"sqlite:///{tmp_path}/s.db"
    study = open_study(spec, url, "s", 12, "fingerprint")
    for _ in range(2):  # the two starting points
        study.study.tell(study.next_trial().number, 0.5)
    study.study.ask()  # then the driver dies

    resumed = open_study(spec, url, "s", 12, "fingerprint")
    trial = resumed.next_trial()
    assert (trial.number, trial.continued, trial.start) == (2, True, None)
    assert {"model.block", "train.lr"} <= set(trial.params), trial.params
    assert trial.config.train.lr == trial.params["train.lr"]
    stored = resumed.trials()[2]
    assert stored.params == trial.params and resumed.proposals() == {"start": 2, "random start-up": 1}


def test_a_starting_point_asked_by_a_driver_that_died_before_its_parameters_runs_as_itself(tmp_path):
    spec = _spec(tmp_path, CONDITIONAL)
    url = f"sqlite:///{tmp_path}/s.db"
    study = open_study(spec, url, "s", 12, "fingerprint")
    study.study.enqueue_trial(spec.start_params("paper"), user_attrs={"seqae.start": "paper"})
    study.study.ask()  # then the driver dies

    trial = open_study(spec, url, "s", 12, "fingerprint").next_trial()
    assert (trial.number, trial.start, trial.continued) == (0, "paper", True)
    assert trial.params == {"model.block": "paper", "model.residual": True, "train.lr": 1e-3}


def test_a_fork_seeds_each_trial_with_the_keys_it_sampled(tmp_path):
    spec = _spec(tmp_path, {**CONDITIONAL, "start": {}})
    url = f"sqlite:///{tmp_path}/s.db"
    origin = open_study(spec, url, "origin", 12, "a")
    for _ in range(6):
        origin.study.tell(origin.next_trial().number, 0.5)
    fork = open_study(spec, url, "fork", 12, "b")
    assert fork.seed_from(origin) == [f"trial {n}: seeded" for n in range(6)]
    assert [t.params for t in fork.forked()] == [t.params for t in origin.trials()]


def test_the_reports_optuna_plots_take_keys_absent_from_some_trials(tmp_path):
    from dashboards.report.optuna_plots import optuna_figures

    spec = _spec(tmp_path, CONDITIONAL)
    url = f"sqlite:///{tmp_path}/s.db"
    study = open_study(spec, url, "s", 12, "fingerprint")
    for _ in range(8):
        trial = study.next_trial()
        study.study.tell(trial.number, trial.params["train.lr"] * 10)
    assert {"model.heads", "model.residual"} - set(study.trials()[0].params)  # some keys are absent from some trials
    paths, notes = optuna_figures(url, "s", tmp_path)
    assert [p.name for p in paths] == ["optuna_history.png", "optuna_importances.png", "optuna_parallel.png"]
    assert notes == []


def test_a_fork_does_not_try_a_starting_point_its_origin_tried(tmp_path):
    spec = _spec(tmp_path, CONDITIONAL)
    url = f"sqlite:///{tmp_path}/s.db"
    origin = open_study(spec, url, "origin", 12, "a")
    for _ in range(3):  # paper, defaults, one proposal
        origin.study.tell(origin.next_trial().number, 0.5)
    fork = open_study(spec, url, "fork", 12, "b")
    fork.seed_from(origin)
    assert fork.next_trial().start is None


ORDERED = {
    "config": {"data": {"input_len": 16}, "model": {"block": "transformer", "d_model": 32, "d_attn": 32, "heads": 2}},
    "search": {
        "model.d_model": {"type": "ordered", "choices": [16, 32, 64]},
        "train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
    },
    "start": {"widest": {"model.d_model": 64}},
    "trials": {"total": 12},
    "sampler": {"type": "tpe", "seed": 0, "n_startup_trials": 4},
}


def test_an_ordered_choice_is_proposed_only_among_its_values_and_the_sampler_sees_its_position(tmp_path):
    """`type: ordered` over 16, 32, 64: Optuna's study holds the position, an integer 0-2 that TPE
    models as a number (its neighbours are the values beside it); the trial's params, its config
    and a fork's seeded trials hold the value; a starting point and a value fixed by position
    cross both ways."""
    import optuna

    spec = _spec(tmp_path, ORDERED)
    url = f"sqlite:///{tmp_path}/s.db"
    study = open_study(spec, url, "s", 12, "fingerprint")
    issued = []
    for _ in range(12):
        trial = study.next_trial()
        study.study.tell(trial.number, trial.params["model.d_model"] / 100)  # wider is better
        issued.append(trial)
    widths = [t.params["model.d_model"] for t in issued]
    assert widths[0] == 64 and issued[0].start == "widest"
    assert set(widths) <= {16, 32, 64} and len(set(widths)) >= 2, widths
    assert [t.config.model.d_model for t in issued] == widths
    recorded = study.study.trials
    assert [t.params["model.d_model"] for t in recorded] == [[16, 32, 64].index(w) for w in widths]
    assert all(t.distributions["model.d_model"] == optuna.distributions.IntDistribution(0, 2) for t in recorded)
    assert [study.trial_spec(t.number).params for t in issued] == [t.params for t in issued]  # read back as values

    fork = open_study(spec, url, "fork", 12, "b")
    fork.seed_from(study)
    assert [spec.values_of(t.params)["model.d_model"] for t in fork.forked()] == widths

    plain = spec_lib.parse({**ORDERED, "start": {}}, "no starting point")
    fixed = open_study(plain, f"sqlite:///{tmp_path}/f.db", "f", 12, "fingerprint")
    fixed.study.enqueue_trial({"model.d_model": 1, "train.lr": 1e-3})  # a position, as a sampler proposes it
    assert fixed.next_trial().params == {"model.d_model": 32, "train.lr": 1e-3}
