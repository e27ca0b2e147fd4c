"""The sweep service end to end: real local Ray, MLflow and Optuna on SQLite, real trials."""

from __future__ import annotations

import json
import re
import signal

import pytest

from tests.sweep_helpers import (
    SMOKE,
    STUDIES,
    kill_group,
    metric_steps,
    mlflow_runs,
    optuna_trials,
    seqae,
    sets,
    start,
    status,
    tune_results,
    wait_for,
)

pytestmark = pytest.mark.slow

# What each study needs on top of SMOKE to run in seconds: a tiny grid, or few trials.
STUDY_SMOKE = {
    "quickstart": ["data.input_len=16", "model.latent_len=8", "trials.total=2"],
    "paper_fig2": ["data.input_len=16", "grid.model.latent_len=[16, 4]"],
    "paper_fig3": ["grid.data.input_len=[16]", "grid.model.latent_fraction=[1.0, 0.25]"],
    "paper_seeds": ["grid.data.input_len,model.latent_len=[[16, 9]]", "grid.train.seed=[0]"],
    "search_lr_dims": ["data.input_len=16", "model.latent_len=8", "trials.total=3", "search.model.layers={type: int, low: 1, high: 2}"],
    "frontier": ["data.input_len=16", "trials.total=3"],
}


def test_every_study_has_a_smoke_setting():
    assert sorted(STUDY_SMOKE) == sorted(p.stem for p in STUDIES.glob("*.yaml"))


@pytest.mark.parametrize("study", sorted(STUDY_SMOKE))
def test_study_runs_in_smoke_mode(study, tmp_path):
    workspace = tmp_path / "ws"
    run = seqae("sweep", "run", str(STUDIES / f"{study}.yaml"), "--workspace", str(workspace),
                *sets(*SMOKE, *STUDY_SMOKE[study]))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    info = status(study, workspace)
    done = sum(info["trials_by_state"].get(s, 0) for s in ("COMPLETE", "PRUNED"))
    assert done == info["trials_total"] >= 2, info
    assert info["best"], info


def test_quickstart_tracks_every_trial_in_mlflow_and_optuna(tmp_path):
    workspace = tmp_path / "ws"
    n = 3
    run = seqae("sweep", "run", str(STUDIES / "quickstart.yaml"), "--workspace", str(workspace),
                *sets(*SMOKE, "data.input_len=16", "model.latent_len=8", f"trials.total={n}"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    runs = mlflow_runs(workspace, "quickstart")
    parents = [r for r in runs if r.data.tags.get("seqae.role") == "sweep"]
    children = [r for r in runs if "seqae.trial" in r.data.tags]
    assert len(parents) == 1 and len(children) == n
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(int(r.data.tags["seqae.trial"]) for r in children) == list(range(n))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
    for child in children:
        tags, params = child.data.tags, child.data.params
        assert tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert tags["optuna.trial_number"] == tags["seqae.trial"]
        assert tags["ray.tune_trial_id"] and tags["ray.node_id"]
        assert params["model.d_model"] == "16" and params["data.input_len"] == "16" and "train.lr" in params
        assert metric_steps(child.info.run_id, "val_token_accuracy", workspace) == [1, 2]
        artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"config.yaml", "checkpoint", "samples.txt"} <= artifacts
        samples = client.download_artifacts(child.info.run_id, "samples.txt", str(tmp_path))
        assert "original:" in open(samples).read()

    trials = optuna_trials(workspace, "quickstart")
    assert [t.state.name for t in trials] == ["COMPLETE"] * n
    assert len({t.params["train.lr"] for t in trials}) == n  # the search sampled, not repeated

    info = status("quickstart", workspace)
    assert info["trials_total"] == n and info["trials_by_state"] == {"COMPLETE": n}
    assert info["mlflow_parent_run_id"] == parents[0].info.run_id
    assert info["optuna_study_name"] == "quickstart" and info["optuna_storage"].startswith("sqlite:///")
    assert info["best"]["values"]["val_token_accuracy"] == max(t.value for t in trials)
    versions = client.search_model_versions("name='quickstart'")
    assert len(versions) == 1 and versions[0].run_id == next(
        c.info.run_id for c in children if int(c.data.tags["seqae.trial"]) == info["best"]["trial"])


def test_driver_killed_mid_sweep_then_resumed(tmp_path):
    workspace, name, n, epochs = tmp_path / "ws", "killed", 4, 5
    args = ["sweep", "run", str(STUDIES / "quickstart.yaml"), "--name", name, "--workspace", str(workspace),
            *sets(*SMOKE, "data.max_pages=20", "data.input_len=16", "model.latent_len=8", f"trials.total={n}",
                  f"train.epochs={epochs}")]
    driver = start(*args, log=tmp_path / "driver.log")
    trials = workspace / "sweeps" / name / "trials"

    def midway():  # some trial has a checkpoint past epoch 1 and has not finished
        for trial in trials.glob("*"):
            metas = sorted(trial.glob("epoch-*/manifest.json"))
            if metas and json.loads(metas[-1].read_text())["meta"]["epoch"] >= 2 and not json.loads(
                    metas[-1].read_text())["meta"]["finished"]:
                return True
        return False

    wait_for(midway, 300, "a trial half-way through")
    kill_group(driver, signal.SIGKILL)  # the driver and the local Ray it started
    driver.wait()
    interrupted = {}
    for trial in trials.glob("*"):
        metas = sorted(trial.glob("epoch-*/manifest.json"))
        meta = json.loads(metas[-1].read_text())["meta"] if metas else None
        if meta and not meta["finished"]:
            interrupted[f"trial-{int(trial.name):04d}"] = meta["epoch"]
    assert interrupted, "the kill should leave a trial unfinished"

    resumed = seqae("sweep", "resume", name, "--workspace", str(workspace))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "was interrupted; it will continue from its checkpoint" in resumed.stdout

    trials_now = optuna_trials(workspace, name)
    assert len(trials_now) == n and {t.state.name for t in trials_now} == {"COMPLETE"}
    runs = mlflow_runs(workspace, name)
    children = [r for r in runs if "seqae.trial" in r.data.tags]
    assert sorted(int(r.data.tags["seqae.trial"]) for r in children) == list(range(n))  # no duplicates
    assert [r.info.status for r in runs if r.info.status == "RUNNING"] == []
    assert len([r for r in runs if r.data.tags.get("seqae.role") == "sweep"]) == 1
    for child in children:
        steps = metric_steps(child.info.run_id, "val_token_accuracy", workspace)
        assert steps == sorted(set(steps)) and steps[0] == 1  # every epoch once, in order

    # The interrupted trials continued from their checkpoints: the second session's first
    # reported epoch follows the checkpoint, and no epoch is reported twice.
    # (A trial's worker may finish one more epoch after the driver died: it continues from the
    # newest checkpoint, which the resumed trial names.)
    reported = tune_results(workspace, name)
    for trial, epoch_at_kill in interrupted.items():
        number = int(trial.split("-")[1])
        continued = re.search(rf"trial {number}: continuing after epoch (\d+)", resumed.stdout)
        assert continued, resumed.stdout[-3000:]
        checkpoint_epoch = int(continued.group(1))
        assert checkpoint_epoch >= epoch_at_kill
        sessions = reported[trial]
        assert len(sessions) == 2, sessions
        assert sessions[1][0] == checkpoint_epoch + 1, (trial, sessions, checkpoint_epoch)
        flat = [e for s in sessions for e in s]
        assert flat == sorted(set(flat))
