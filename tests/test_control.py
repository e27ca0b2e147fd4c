"""Steering sweeps on real components (local Ray, SQLite, real trials): `seqae sweep stop`, `seqae
sweep set NAME max_concurrent=N`, an objective's target, a budget, ASHA across a driver kill, and
`seqae sweep fork`."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from seqae import Sweep
from sweeps.stores import ownership
from tests import sweep_helpers as helpers
from tests.rotation import rotated
from tests.sweep_helpers import STUDIES, TINY, optuna_trials, run_args, seqae, start, status, trial_metas, wait_for

pytestmark = pytest.mark.slow


def trials(workspace, name) -> list:
    """The study's trials; none before the driver has created the study."""
    if not (workspace / "optuna.db").exists():
        return []
    try:
        return optuna_trials(workspace, name)
    except KeyError:
        return []


def states(workspace, name) -> list[str]:
    return [t.state.name for t in trials(workspace, name)]


def each_epoch_tracked_once(workspace, name, epochs: dict[int, int]) -> None:
    """Each trial's run has the validation accuracy of every epoch it trained (to ``epochs[n]``), once."""
    runs = {
        int(r.data.tags["seqae.trial"]): r for r in helpers.mlflow_runs(workspace, name) if "seqae.trial" in r.data.tags
    }
    assert sorted(runs) == sorted(epochs), (sorted(runs), epochs)
    for number, run in runs.items():
        steps = helpers.metric_steps(run.info.run_id, "val_token_accuracy", workspace)
        assert steps == list(range(1, epochs[number] + 1)), (number, steps)


# Trials of 1,000 epochs: none ends before the test stops it, on any machine, so what the test
# does between two events (a command's start, a status read) races nothing.
ENDLESS = ["train.epochs=1000", "train.patience=1000"]


def test_set_max_concurrent_then_stop_drains_then_stop_now_ends_the_running_trials_and_resume_continues_them(tmp_path):
    """`seqae sweep set NAME max_concurrent=2` starts a second trial; `stop` starts no more while
    both run on; `stop --now` ends both at their epoch, left to continue; `resume` lifts the drain
    and continues each from that epoch, none trained or tracked twice."""
    workspace, name = tmp_path / "ws", "steer"
    storage, log = workspace / "sweeps" / name, tmp_path / "driver.log"
    driver = start(*run_args(workspace, name, "trials.total=4", "max_concurrent=1", *ENDLESS), log=log)
    try:  # the driver has created the study (reading it sooner would race its schema creation)
        wait_for(lambda: "trial 0  epoch 1/" in log.read_text(), 180, "the first epoch")
        assert states(workspace, name) == ["RUNNING"]  # max_concurrent=1 from the file
        raised = seqae("sweep", "set", name, "max_concurrent=2", "--workspace", str(workspace))
        assert raised.returncode == 0, raised.stderr
        wait_for(lambda: states(workspace, name).count("RUNNING") == 2, 180, "two trials running at once")
        Sweep.open(name, workspace).stop()  # through the Python API; `seqae sweep stop` makes the same call
        wait_for(
            lambda: f"draining (stopped by {ownership.actor()} from Python)" in log.read_text(),
            180,
            "the driver to drain",
        )
        assert "the running ones (2) finish" in log.read_text()
        # both train (the queue's count of a sweep's trials in Tune follows its driver's beat, every 2 s)
        wait_for(
            lambda: status(name, workspace)["trials_by_state"] == {"RUNNING": 2, "NOT_STARTED": 2},
            30,
            "status to show the two trials training",
        )
        now = seqae("sweep", "stop", name, "--now", "--workspace", str(workspace))
        assert now.returncode == 0 and "the running ones stop at the end of their epoch" in now.stdout, now.stderr
        assert driver.wait(timeout=300) == 0
    finally:
        driver.kill()
    text = log.read_text()
    assert "max_concurrent 1 -> 2" in text, text[-3000:]
    stopped_at = {n: m["epoch"] for n, m in trial_metas(storage).items()}
    assert sorted(stopped_at) == [0, 1] and min(stopped_at.values()) >= 1, stopped_at
    for number, epoch in stopped_at.items():
        assert f"trial {number}  stopped by `seqae sweep stop --now` after {epoch} epoch" in text, text[-3000:]
    info = status(name, workspace)
    assert info["outcome"] == "stopped" and info["trials_by_state"] == {"RUNNING": 2, "NOT_STARTED": 2}
    assert info["control"]["max_concurrent"] == 2 and info["control"]["now"] is True
    shown = seqae("sweep", "status", name, "--workspace", str(workspace)).stdout
    assert f"stopped: no new trials (stopped by {ownership.actor()} with `seqae sweep stop --now`)" in shown, shown
    assert "the running ones stop at the end of their epoch" in shown, shown
    runs = helpers.mlflow_runs(workspace, name)
    for run in runs:  # left to continue: paused, as after Ctrl-C
        assert run.info.status == "KILLED", (run.info.run_name, run.info.status)
        if "seqae.trial" in run.data.tags:
            assert run.data.tags["seqae.outcome"] == "interrupted"
    each_epoch_tracked_once(workspace, name, stopped_at)

    resumed_log = tmp_path / "resumed.log"
    resumed = start("sweep", "resume", name, "--workspace", str(workspace), log=resumed_log)

    def trained_on() -> bool:
        metas = trial_metas(storage)
        return all(metas[n]["epoch"] > e for n, e in stopped_at.items())

    try:
        wait_for(trained_on, 300, "both trials to train on")
        Sweep.open(name, workspace).stop(now=True)
        assert resumed.wait(timeout=300) == 0, resumed_log.read_text()[-3000:]
    finally:
        resumed.kill()
    text = resumed_log.read_text()
    assert "resuming lifts that" in text, text[-3000:]
    for number, epoch in stopped_at.items():
        assert f"trial {number}: continuing after epoch {epoch}" in text, text[-3000:]
    assert states(workspace, name) == ["RUNNING", "RUNNING"]  # continued, not started over: no third trial
    each_epoch_tracked_once(workspace, name, {n: m["epoch"] for n, m in trial_metas(storage).items()})  # the same runs
    assert [e for e in status(name, workspace)["control"]["log"] if "max_concurrent" in e][0]["max_concurrent"] == 2


def test_a_reached_target_drains_the_sweep_and_extend_trains_its_best_trial_on(tmp_path):
    workspace, name = tmp_path / "ws", "goal"
    run = seqae(*run_args(workspace, name, "trials.total=6", "train.epochs=3", "objective.target=0.0"))
    assert run.returncode == 0, run.stdout[-3000:]
    assert "draining (trial " in run.stdout and "reached val_token_accuracy" in run.stdout
    finished = states(workspace, name)
    assert 1 <= len(finished) <= 2 and set(finished) == {"COMPLETE"}  # only those started before the first result
    info = status(name, workspace)
    assert info["outcome"] == "stopped" and "the target 0.0" in info["control"]["drain"]
    # reaching the target is a sweep's best ending: its run FINISHED, saying why, and its best model registered
    parent = next(r for r in helpers.mlflow_runs(workspace, name) if r.data.tags.get("seqae.role") == "sweep")
    assert parent.info.status == "FINISHED" and "the target 0.0" in parent.data.tags["seqae.ended"]
    registry = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
    best_run = {r.data.tags.get("seqae.trial"): r.info.run_id for r in helpers.mlflow_runs(workspace, name)}
    champion = registry.get_model_version_by_alias(name, "best")
    assert str(champion.version) == "1" and champion.run_id == best_run[str(info["best"]["trial"])]

    ws = ["--workspace", str(workspace)]
    for args, message in (
        (["--epochs", "3"], "already trained 3 epochs"),
        (["--epochs", "5", "--trials", "7"], "trial 7 is not in the sweep"),
        (["--trials", "9995"], "--trials=9,995 (sweep 'goal' would have 10,001 trials) is above"),
    ):
        refused = seqae("sweep", "extend", name, *args, *ws)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    best = info["best"]["trial"]
    extended = seqae("sweep", "extend", name, "--epochs", "5", *ws)
    assert extended.returncode == 0, extended.stdout[-3000:]
    assert f"trial {best}: trains on from epoch 3 to 5" in extended.stdout
    history = trial_metas(workspace / "sweeps" / name)[best]["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3, 4, 5]
    after = status(name, workspace)  # still stopped: only the chosen trial trained; no new trial started
    assert after["outcome"] == "stopped" and after["trials_by_state"] == info["trials_by_state"]
    top = max(history, key=lambda h: (h["val_token_accuracy"], -h["epoch"]))
    assert after["best"]["trial"] == best and after["best"]["values"]["val_token_accuracy"] == top["val_token_accuracy"]
    record = trials(workspace, name)[-1]  # the Optuna trial that continues it, with every epoch's value
    assert record.user_attrs["seqae.continues"] == best and record.state.name == "COMPLETE"
    assert sorted(record.intermediate_values) == [1, 2, 3, 4, 5]
    run_ids = [
        r.info.run_id for r in helpers.mlflow_runs(workspace, name) if r.data.tags.get("seqae.trial") == str(best)
    ]
    assert len(run_ids) == 1  # the same MLflow run, now with five epochs
    assert sorted(helpers.metric_steps(run_ids[0], "val_token_accuracy", workspace)) == [1, 2, 3, 4, 5]
    # a new version only when the best trial's kept checkpoint changed; @best points at the newest such
    versions = registry.search_model_versions(f"name='{name}'")
    champion = registry.get_model_version_by_alias(name, "best")
    assert champion.run_id == run_ids[0] and champion.tags["seqae.epoch"] == str(top["epoch"])
    assert len(versions) == (1 if top["epoch"] <= 3 else 2), [(v.version, v.tags) for v in versions]


RUNGS = [
    "scheduler.grace_period=1",
    "scheduler.reduction_factor=2",
    "max_concurrent=1",
    "train.epochs=4",
    "train.patience=4",
    "train.lr_schedule=constant",
    "search={}",
    "start={}",
    "grid.train.lr=[0.03, 0.0001, 0.01, 0.00003, 0.003, 0.001]",
]


def outcomes(workspace, name) -> dict[int, tuple]:
    """Each trial's state, and a complete trial's value. (A pruned trial's value is its last epoch's,
    and Tune may let a trial train one epoch past ASHA's stop while the decision travels.)"""
    return {t.number: (t.state.name, t.values if t.state.name == "COMPLETE" else None) for t in trials(workspace, name)}


# Two objectives: accuracy and the latent's share, three learning rates at two latent lengths.
TWO_OBJECTIVES = [
    "objective=[{metric: val_token_accuracy, mode: max}, {metric: latent_share, mode: min}]",
    "grid.train.lr=[0.03, 0.0001, 0.003]",
    "grid.model.latent_len=[8, 4]",
]


@pytest.mark.parametrize(
    "scheduler, extra",
    rotated(
        [("asha", ("asha", [])), ("hyperband", ("hyperband", [])), ("asha-two-objectives", ("asha", TWO_OBJECTIVES))]
    ),
)
def test_asha_makes_the_same_stop_decisions_after_a_driver_kill(tmp_path, scheduler, extra):
    """Ray's ASHA forgets its rungs with its driver; seqae rebuilds them from the trials' records,
    so a sweep killed mid-trial and resumed prunes exactly the trials an uninterrupted one does.
    Hyperband's too: each trial's bracket comes from its number, so the resumed driver puts every
    trial back in the bracket it had. And with two objectives, whose rungs rank by non-dominated
    sorting (a trial's values are then its objectives')."""
    workspace = tmp_path / "ws"
    plain = seqae(*run_args(workspace, "plain", f"scheduler.type={scheduler}", *RUNGS, *extra))
    assert plain.returncode == 0, plain.stdout[-3000:]
    expected = outcomes(workspace, "plain")
    states_seen = [state for state, _ in expected.values()]
    assert len(expected) == 6 and "PRUNED" in states_seen and "COMPLETE" in states_seen, expected  # not vacuous
    # a pruned trial ended as a search means it to: FINISHED in MLflow, its outcome in a tag
    runs = {
        int(r.data.tags["seqae.trial"]): r
        for r in helpers.mlflow_runs(workspace, "plain")
        if "seqae.trial" in r.data.tags
    }
    assert {n: (r.info.status, r.data.tags["seqae.outcome"]) for n, r in runs.items()} == {
        n: ("FINISHED", state.lower()) for n, (state, _) in expected.items()
    }

    driver = start(
        *run_args(workspace, "killed", f"scheduler.type={scheduler}", *RUNGS, *extra), log=tmp_path / "driver.log"
    )
    storage = workspace / "sweeps" / "killed"
    try:  # kill the driver while a trial past the first rung is still training, held there (sweep_helpers.held)
        wait_for(
            lambda: helpers.held(
                driver,
                lambda: any(
                    meta["epoch"] >= 1 and not meta["finished"] and number >= 2
                    for number, meta in trial_metas(storage).items()
                ),
            ),
            300,
            "trial 2 or later mid-training",
            every=0.05,
        )
    finally:
        helpers.kill_group(driver)
        driver.wait(timeout=60)
    assert len(outcomes(workspace, "killed")) < 6  # the kill came before the end
    resumed = seqae("sweep", "resume", "killed", "--workspace", str(workspace))
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert outcomes(workspace, "killed") == expected


def test_a_spent_budget_stops_the_running_trial_at_its_epoch_and_the_sweep_and_every_trial_shows_its_cost(
    tmp_path, receiver
):
    workspace, name = tmp_path / "ws", "budget"
    # 1e-7 cpu-hours is 0.36 ms: spent by the first epoch on any machine
    run = seqae(
        *run_args(
            workspace,
            name,
            "trials.total=6",
            "max_concurrent=1",
            "train.epochs=2",
            "budget.cpu_hours=1e-7",
            receiver.notify(),
        )
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert "the budget of 1e-07 cpu-hours is spent" in run.stdout
    # told that no new trial starts, then that the sweep ended, stopped
    assert f"seqae {name}: no new trials start" in receiver.titles(), receiver.titles()
    assert receiver.titles()[-1] == f"seqae {name}: the sweep is stopped", receiver.titles()
    assert "the budget of 1e-07 cpu-hours is spent" in next(
        m["message"] for m in receiver.received if m["title"].endswith("no new trials start")
    )
    info = status(name, workspace)
    # one trial at a time, and its first epoch spends the budget: it stops there, not at its last epoch
    assert info["outcome"] == "stopped" and info["trials_by_state"] == {"COMPLETE": 1, "NOT_STARTED": 5}
    assert "trial 0  stopped by the budget after 1 epoch" in run.stdout
    # told how to go on: a resume would start nothing, a fork with a larger budget does
    assert (
        f"its budget is spent, so resuming starts no trial; go on in a fork with a larger one: `seqae sweep fork "
        f"{name} --file FILE --name NEW --set budget.cpu_hours=H`"
    ) in run.stdout, run.stdout[-3000:]
    assert "continue it with `seqae sweep resume" not in run.stdout
    run_id = next(r.info.run_id for r in helpers.mlflow_runs(workspace, name) if "seqae.trial" in r.data.tags)
    assert helpers.metric_steps(run_id, "val_token_accuracy", workspace) == [1]
    runs = helpers.mlflow_runs(workspace, name)
    parent = next(r for r in runs if r.data.tags.get("seqae.role") == "sweep")
    assert (
        parent.info.status == "FINISHED" and "the budget of 1e-07 cpu-hours is spent" in parent.data.tags["seqae.ended"]
    )
    # the budget, not a rung, stopped it: complete, and the sweep's best
    assert [(r.info.status, r.data.tags["seqae.outcome"]) for r in runs if r is not parent] == [
        ("FINISHED", "complete")
    ]
    assert info["best"]["trial"] == 0, info["best"]
    cost = info["cost"]
    assert cost["unit"] == "cpu-hours" and cost["budget"] == 1e-7 and cost["hours"] >= 1e-7
    children = {
        r.data.tags["seqae.trial"]: r for r in helpers.mlflow_runs(workspace, name) if "seqae.trial" in r.data.tags
    }
    assert set(children) == set(cost["per_trial_seconds"])
    for number, seconds in cost["per_trial_seconds"].items():  # resources.cpu=1: cost = training wall time
        assert seconds > 0 and abs(children[number].data.metrics["resource_seconds"] - seconds) < 0.01
    page = (workspace / "sweeps" / name / "report" / "index.html").read_text()
    assert "cost (cpu-s)" in page and "accuracy per cpu-hour" in page
    # resumed, it starts nothing: resuming lifts the drain, and the spent budget puts it back
    resumed = seqae("sweep", "resume", name, "--workspace", str(workspace))
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "draining (the budget of 1e-07 cpu-hours is spent" in resumed.stdout, resumed.stdout[-3000:]
    assert "its budget is spent, so resuming starts no trial" in resumed.stdout
    assert status(name, workspace)["trials_by_state"] == {"COMPLETE": 1, "NOT_STARTED": 5}


def test_fork_seeds_a_new_study_with_the_finished_trials_that_fit(tmp_path):
    workspace = tmp_path / "ws"
    wide = seqae(*run_args(workspace, "wide", "trials.total=4", "train.epochs=2"))  # random search over train.lr only
    assert wide.returncode == 0, wide.stdout[-3000:]
    lrs = sorted(t.params["train.lr"] for t in trials(workspace, "wide"))
    narrowed = f"search.train.lr={{type: loguniform, low: {lrs[2]!r}, high: 1.0e-2}}"  # two of the four fit
    fork = seqae(
        "sweep",
        "fork",
        "wide",
        "--file",
        str(STUDIES / "quickstart.yaml"),
        "--name",
        "narrow",
        "--workspace",
        str(workspace),
        *helpers.sets(*TINY, "trials.total=2", "train.epochs=2", narrowed, "start={}"),
    )  # its lr may lie outside
    assert fork.returncode == 0, fork.stdout[-3000:]
    assert fork.stdout.count(": seeded") == 2 and fork.stdout.count("outside the new space") == 2, fork.stdout

    import optuna

    study = optuna.load_study(study_name="narrow", storage=f"sqlite:///{workspace / 'optuna.db'}")
    seeded = [t for t in study.trials if "seqae.forked_from" in t.user_attrs]
    assert sorted(t.params["train.lr"] for t in seeded) == lrs[2:]
    assert {t.user_attrs["seqae.forked_from"].split("#")[0] for t in seeded} == {"wide"}
    assert all(t.state.name == "COMPLETE" and t.value is not None for t in seeded)
    info = status("narrow", workspace)  # the seeded trials are not the sweep's own: two of its own ran
    assert info["trials_by_state"] == {"COMPLETE": 2} and info["seeded_trials"] == 2 and info["forked_from"] == "wide"
    own = [t for t in study.trials if "seqae.forked_from" not in t.user_attrs]
    assert all(lrs[2] <= t.params["train.lr"] <= 1.0e-2 for t in own)
    parent = next(r for r in helpers.mlflow_runs(workspace, "narrow") if r.data.tags.get("seqae.role") == "sweep")
    assert parent.data.params["sweep.forked_from"] == "wide"
