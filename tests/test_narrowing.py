"""Narrowing a sweep's search space in place (`seqae sweep set NAME search.KEY=...`): the study
keeps the narrowed space, the sampler proposes only inside it, the trials outside stay marked."""

from __future__ import annotations

import re

import pytest
import yaml

from seqae_errors import ConfigError
from sweeps.spec import sweep as spec_lib
from sweeps.stores.search import open_study, read_only

WIDE = {
    "config": {"data": {"input_len": 16}, "model": {"block": "transformer", "d_attn": 32, "d_ffn": 64}},
    "search": {
        "model.heads": {"type": "categorical", "choices": [1, 2, 4, 8]},
        "model.d_model": {"type": "int", "low": 16, "high": 64, "step": 16},
        "train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
        "train.weight_decay": {"type": "uniform", "low": 0.0, "high": 0.1},
    },
    "trials": {"total": 40},
}
NARROW = {
    "model.heads": [2, 4],
    "model.d_model": [32, 48],
    "train.lr": [1e-3, 3e-3],
    "train.weight_decay": {"low": 0.02, "high": 0.05},
}


def _spec(tmp_path, sampler: str) -> spec_lib.SweepSpec:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(WIDE, sort_keys=False))
    # GP models numeric spaces only: the heads are pinned there
    return spec_lib.load(path, [f"sampler={sampler}", *(["model.heads=2"] if "gp" in sampler else [])])


def score(params: dict) -> float:
    """Best at what the narrowing takes away (one head, the widest model, the highest lr), so a
    sampler that learned from the first trials would propose outside the new space."""
    return (params.get("model.heads") == 1) + params["model.d_model"] / 64 + params["train.lr"] * 100


@pytest.mark.parametrize(
    "sampler",
    [
        pytest.param("{type: tpe, seed: 1, n_startup_trials: 4, multivariate: true, group: true}", id="tpe-group"),
        pytest.param("{type: tpe, seed: 1, n_startup_trials: 4}", id="tpe"),
        pytest.param("{type: gp, seed: 1, n_startup_trials: 4}", id="gp"),
        pytest.param("{type: nsga2, seed: 1}", id="nsga2"),
        pytest.param("{type: random, seed: 1}", id="random"),
    ],
)
def test_after_narrowing_every_proposal_is_inside_the_new_space_and_the_trials_outside_are_marked(tmp_path, sampler):
    """Ten trials in the wide space; the space narrowed by another process (as `seqae sweep set`
    from another machine writes the study) while the driver's study stays open; the next 20
    proposals of that driver, and 5 of a resumed one, all inside the narrowed ranges and choices."""
    spec, url = _spec(tmp_path, sampler), f"sqlite:///{tmp_path}/s.db"
    driver = open_study(spec, url, "s", 40, "fingerprint")
    for _ in range(10):
        trial = driver.next_trial()
        driver.study.tell(trial.number, score(trial.params))
    user = read_only(spec, url, "s")
    for key, value in NARROW.items():
        if key in spec.search:
            user.narrow(key, value, by="alice")
    space = driver.space()

    def inside(params: dict) -> bool:
        return all(space[k].contains(v) for k, v in params.items())

    proposed = []
    for _ in range(20):
        trial = driver.next_trial()
        driver.study.tell(trial.number, score(trial.params))
        proposed.append(trial.params)
    resumed = open_study(spec, url, "s", 40, "fingerprint")
    for _ in range(5):
        trial = resumed.next_trial()
        resumed.study.tell(trial.number, score(trial.params))
        proposed.append(trial.params)
    assert len(proposed) == 25 and all(inside(p) for p in proposed), [p for p in proposed if not inside(p)]
    if "model.heads" in spec.search:
        assert {p["model.heads"] for p in proposed} == {2, 4}  # both kept choices, not one
    print(
        sampler,
        "proposals after narrowing:",
        [tuple(round(v, 4) if isinstance(v, float) else v for v in p.values()) for p in proposed],
    )
    outside = user.outside()
    first = [t for t in user.trials() if t.number < 10]
    assert set(outside) == {t.number for t in first if not inside(t.params)} and outside
    assert all(t.number not in outside for t in user.trials() if t.number >= 10)


def test_a_narrowing_may_only_shrink_a_range_or_drop_choices(tmp_path):
    """Widening, a new choice, another type or step, a key the sweep does not search: refused in one
    line that names the key and says to fork; narrowing twice narrows the narrowed space."""
    spec, url = _spec(tmp_path, "{type: random, seed: 0}"), f"sqlite:///{tmp_path}/s.db"
    open_study(spec, url, "s", 40, "fingerprint")
    study = read_only(spec, url, "s")
    for key, value, message in (
        (
            "model.heads",
            [2, 3],
            "search.model.heads: 3 is not one of its choices [1, 2, 4, 8]: choices are removed, "
            "never added; a wider or different space is a new sweep: `seqae sweep fork`",
        ),
        (
            "train.lr",
            [1e-5, 1e-3],
            "search.train.lr: [1e-05, 0.001] is wider than its range [0.0001, 0.01]: a range shrinks, never grows",
        ),
        ("model.d_model", {"type": "int", "low": 16, "high": 64, "step": 32}, "only its range or choices may narrow"),
        ("model.d_model", [24, 48], "search.model.d_model: low=24 is not on its step 16 from 16"),
        ("model.latent_len", [4, 8], "search.model.latent_len: the sweep does not search model.latent_len"),
        ("train.lr", "fast", "search.train.lr='fast': give the choices to keep"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)) as refused:
            study.narrow(key, value, by="alice")
        assert "\n" not in str(refused.value)
    study.narrow("model.heads", [2, 4, 8], by="alice")
    study.narrow("model.heads", [4], by="alice")
    with pytest.raises(ConfigError, match="2 is not one of its choices \\[4\\]"):
        study.narrow("model.heads", [2, 4], by="alice")
    assert study.space()["model.heads"].choices == (4,)


def test_sweep_set_narrows_a_sweeps_space_and_status_marks_the_trials_outside(tmp_path, monkeypatch):
    """`seqae sweep set NAME search.train.lr=[...]` on a sweep whose study holds trials (as its
    driver left them): one line saying so, the study's space narrowed, `status` naming the
    narrowing and the trials outside; a wider range refused in one line (exit 2) saying to fork."""
    from seqae import Sweep
    from tests.sweep_helpers import STUDIES, TINY, in_process

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    workspace = tmp_path / "ws"
    sweep = Sweep.create(STUDIES / "quickstart.yaml", set=TINY, name="q", workspace=workspace)
    state = sweep.workspace.read("q")
    driver = open_study(state.spec, state.backends.optuna_storage, "q", 6, state.fingerprint)
    for _ in range(4):
        trial = driver.next_trial()
        driver.study.tell(trial.number, 0.5)
    lrs = {t.number: t.params["train.lr"] for t in driver.trials()}
    ws = ["--workspace", str(workspace)]
    done = in_process(["sweep", "set", "q", "search.train.lr=[2.0e-3, 5.0e-3]", *ws], 60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "sweep q: search.train.lr narrowed to {'type': 'loguniform', 'low': 0.002, "
        "'high': 0.005} from its next proposal on"
    ), done.stdout
    print(done.stdout)
    wider = in_process(["sweep", "set", "q", "search.train.lr=[1.0e-3, 5.0e-3]", *ws], 60)
    assert wider.returncode == 2 and wider.stderr.count("\n") == 1 and "seqae sweep fork" in wider.stderr, wider.stderr
    print(wider.stderr)
    shown = in_process(["sweep", "status", "q", *ws], 60)
    print(shown.stdout)
    outside = sorted(n for n, lr in lrs.items() if not 2e-3 <= lr <= 5e-3)
    assert outside and f"{len(outside)} trials lie outside the narrowed space" in shown.stdout, shown.stdout
    assert "note: search.train.lr narrowed in place to [0.002, 0.005]" in shown.stdout and "by alice)" in shown.stdout
    trial = driver.next_trial()
    assert 2e-3 <= trial.params["train.lr"] <= 5e-3


@pytest.mark.slow
def test_a_running_sweep_proposes_its_next_trial_inside_the_space_narrowed_while_it_runs(tmp_path):
    """A quickstart driver stopped (SIGSTOP) while its study holds only its first trial (the
    starting point, at lr 1e-3); the space narrowed from Python meanwhile; the driver goes on: its
    next trial's lr is inside the new range, and the first stays in the history, marked outside."""
    import os
    import signal
    import sqlite3
    from contextlib import closing

    import optuna

    from seqae import Sweep
    from tests.sweep_helpers import held, kill_group, run_args, start, status, wait_for

    workspace, name = tmp_path / "ws", "live"
    driver = start(*run_args(workspace, name, "trials.total=2", "train.epochs=1"), log=tmp_path / "driver.log")
    url = f"sqlite:///{workspace / 'optuna.db'}"

    def one_trial() -> bool:
        # Read-only SQL, not optuna.load_study: a storage opened while the driver is still creating
        # its tables races it to insert alembic's version row (UNIQUE constraint failed, in CI).
        if not (workspace / "optuna.db").exists():
            return False
        try:
            with closing(sqlite3.connect(f"file:{workspace / 'optuna.db'}?mode=ro", uri=True)) as db:
                (count,) = db.execute(
                    "SELECT count(*) FROM trials JOIN studies USING (study_id) WHERE study_name = ?", (name,)
                ).fetchone()
        except sqlite3.OperationalError:  # before the tables exist, or while they are being written
            return False
        return count == 1

    try:
        wait_for(lambda: held(driver, one_trial), 300, "the driver stopped with one trial in its study")
        Sweep(name, workspace).narrow("train.lr", [5.0e-3, 1.0e-2])
        os.kill(driver.pid, signal.SIGCONT)
        assert driver.wait(600) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            kill_group(driver)
    trials = optuna.load_study(study_name=name, storage=url).trials
    assert [t.params["train.lr"] for t in trials][0] == 1e-3 and 5e-3 <= trials[1].params["train.lr"] <= 1e-2, trials
    notes = status(name, workspace)["notes"]
    assert "1 trial lies outside the narrowed space, kept in the history: 0 (train.lr)" in notes, notes
