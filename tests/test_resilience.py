"""Faults and bad input, on real components: local Ray, SQLite, MLflow servers, real trials.
Each test is one scenario of docs/explanation/resilience.md; the multi-node ones live in test_cluster.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from cluster.procs import free_port
from seqae import Sweep
from seqae_core.checkpoint import CheckpointStore
from tests.conftest import REPO
from tests.sweep_helpers import (
    STUDIES,
    finished,
    held,
    kill_group,
    metric_steps,
    mlflow_runs,
    optuna_trials,
    run_args,
    seqae,
    start,
    trial_metas,
    tune_results,
    wait_for,
    wait_for_writers_to_exit,
)

pytestmark = pytest.mark.slow


def children(runs: list) -> list:
    return [r for r in runs if "seqae.trial" in r.data.tags]


def assert_books_balanced(workspace: Path, name: str, n: int, epochs: int | None = None) -> None:
    """n trials, each one FINISHED child run and one COMPLETE Optuna trial; nothing RUNNING. Each
    run has every epoch, every point of its loss curve and its system metrics once, and one dataset."""
    trials = optuna_trials(workspace, name)
    assert len(trials) == n and {t.state.name for t in trials} == {"COMPLETE"}, [t.state.name for t in trials]
    runs = mlflow_runs(workspace, name)
    kids = children(runs)
    assert sorted(int(r.data.tags["seqae.trial"]) for r in kids) == list(range(n))  # one run per trial
    assert {r.info.status for r in runs} == {"FINISHED"}, [(r.info.run_name, r.info.status) for r in runs]
    for kid in kids:
        steps = metric_steps(kid.info.run_id, "val_token_accuracy", workspace)
        assert steps == sorted(set(steps)) and steps[0] == 1, steps  # every epoch once
        if epochs is not None:
            assert steps == list(range(1, epochs + 1)), steps
        every, last = int(kid.data.params["train.log_every_steps"]), int(kid.data.metrics["global_step"])
        points = metric_steps(kid.info.run_id, "train_loss_steps", workspace)
        assert points == list(range(every, last + 1, every)), points
        assert metric_steps(kid.info.run_id, "system/cpu_utilization_percentage", workspace) == steps
        assert len(kid.inputs.dataset_inputs) == 1


# 1 and 8 ---------------------------------------------------------------------------------------
def test_driver_sigkill_after_three_of_eight_then_resume(tmp_path):
    """Scenario 1 (and 8: the stale state a crash leaves is reconciled before new trials start)."""
    workspace, name = tmp_path / "ws", "kill8"
    storage = workspace / "sweeps" / name
    driver = start(*run_args(workspace, name, "trials.total=8", "train.epochs=3"), log=tmp_path / "driver.log")

    def three_done_and_one_midway() -> bool:
        # a trial one epoch in, too: the kill must leave an interrupted trial behind; held (below),
        # it gets at most one epoch further, so it stays unfinished
        metas = trial_metas(storage)
        done = {n for n, m in metas.items() if m["finished"]}
        return len(done) >= 3 and any(m["epoch"] == 1 and not m["finished"] for m in metas.values())

    wait_for(
        lambda: held(driver, three_done_and_one_midway),
        400,
        "three finished trials and one a single epoch in",
        every=0.05,
    )
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    wait_for_writers_to_exit(storage)  # a worker may finish the epoch it was in
    done_before = finished(storage)
    assert 3 <= len(done_before) < 8  # the trial one epoch in had two to go, and no driver started more

    # the crash left stale state behind: RUNNING trials in Optuna, RUNNING runs in MLflow
    assert "RUNNING" in {t.state.name for t in optuna_trials(workspace, name)}
    assert "RUNNING" in {r.info.status for r in mlflow_runs(workspace, name)}

    resumed = seqae("sweep", "resume", name, "--workspace", str(workspace))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    lines = resumed.stdout.splitlines()
    reconciled = [i for i, line in enumerate(lines) if "closed as" in line or "was interrupted" in line]
    planned = next(i for i, line in enumerate(lines) if "trials planned" in line)
    assert reconciled and max(reconciled) < planned  # reconciled before any new trial starts

    assert_books_balanced(workspace, name, 8, epochs=3)
    ids = [r.data.tags["ray.tune_trial_id"] for r in children(mlflow_runs(workspace, name))]
    assert len(set(ids)) == 8  # each Tune trial id maps to exactly one run
    # a finished trial never trained again: the resumed driver's Tune session has no folder for it
    # (the killed driver's session may have none either: see below)
    sessions = sorted((storage / "tune").glob("session-*"))
    assert len(sessions) == 2, sessions
    for number in done_before:
        assert not (sessions[-1] / f"trial-{number:04d}").exists(), number
    reported = tune_results(workspace, name)
    # the interrupted trials continued from their checkpoints: no epoch trained or reported twice.
    # (The killed driver may not have written a trial's results, or the trial, to Tune's files:
    # the worker checkpoints an epoch before the driver hears of it.)
    continued = {int(n): int(e) for n, e in re.findall(r"trial (\d+): continuing after epoch (\d+)", resumed.stdout)}
    assert continued, resumed.stdout[-3000:]
    for number, epoch in continued.items():
        sessions = reported[f"trial-{number:04d}"]
        assert sessions[-1][0] == epoch + 1, (number, sessions, epoch)
        flat = [e for s in sessions for e in s]
        assert flat == sorted(set(flat))


def test_a_starting_point_of_two_seeds_runs_first_under_its_name_to_its_last_epoch_across_a_driver_kill(tmp_path):
    """A starting point (sweep file ``start``) is the first trial, named in the progress lines,
    Optuna, MLflow and status; ASHA never stops it (tests/test_scheduler.py shows the rule), so
    it trains all its epochs, also when its driver is killed midway and the sweep resumed. Every
    trial trains two seeds (train.repeats=2): its objective is their mean, and the progress lines,
    MLflow, status and the report show each seed's value and the standard error."""
    workspace, name = tmp_path / "ws", "start"
    storage = workspace / "sweeps" / name
    args = run_args(
        workspace,
        name,
        "trials.total=3",
        "train.epochs=4",
        "max_concurrent=1",
        "scheduler.type=asha",
        "scheduler.grace_period=1",
        "scheduler.reduction_factor=2",
        "start={slow: {train.lr: 1.2e-3}}",
        "train.repeats=2",
    )
    log = tmp_path / "driver.log"
    driver = start(*args, log=log)
    # the driver prints a trial's epoch after the trial's worker has checkpointed it, so the kill
    # waits for the printed line, which shows the starting point's name and its seeds' spread
    first_epoch = re.compile(
        r"^trial 0  epoch 1/4  start slow: lr=1\.2e-03 .* val_token_accuracy 0\.\d{4} ± 0\.\d{4}  best", re.M
    )
    wait_for(
        lambda: held(driver, lambda: first_epoch.search(log.read_text()) and 0 not in finished(storage)),
        300,
        "the starting point's first epoch printed",
        every=0.05,
    )
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    wait_for_writers_to_exit(storage)
    assert 0 not in finished(storage)

    resumed = seqae("sweep", "resume", name, "--workspace", str(workspace))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert re.search(r"trial 0: continuing after epoch \d", resumed.stdout), resumed.stdout[-3000:]

    first = optuna_trials(workspace, name)[0]
    assert first.user_attrs["seqae.start"] == "slow" and first.user_attrs["seqae.proposed_by"] == "start"
    assert first.state.name == "COMPLETE" and sorted(first.intermediate_values) == [1, 2, 3, 4]
    assert first.params["train.lr"] == 1.2e-3
    run = next(r for r in children(mlflow_runs(workspace, name)) if r.data.tags["seqae.trial"] == "0")
    assert (run.data.tags["seqae.start"], run.info.run_name, run.info.status) == ("slow", "trial-0000-slow", "FINISHED")
    for metric in (
        "val_token_accuracy",
        "seed_0/val_token_accuracy",
        "seed_1/val_token_accuracy",
        "val_token_accuracy_stderr",
        "seed_1/test_token_accuracy",
    ):
        assert metric_steps(run.info.run_id, metric, workspace) == [1, 2, 3, 4], metric
    info = json.loads(seqae("sweep", "status", name, "--workspace", str(workspace), "--json").stdout)
    assert info["starts"]["slow"]["trial"] == 0 and info["starts"]["slow"]["state"] == "COMPLETE"
    assert info["proposed_by"]["start"] == 1 and sum(info["proposed_by"].values()) == 3
    seeds = info["starts"]["slow"]["seeds"]
    for metric in ("val_token_accuracy", "test_token_accuracy"):
        each = [seeds[f"seed_{s}/{metric}"] for s in (0, 1)]
        assert seeds[f"{metric}_stderr"] == pytest.approx(abs(each[0] - each[1]) / 2)
    assert info["starts"]["slow"]["values"]["val_token_accuracy"] == pytest.approx(
        sum(seeds[f"seed_{s}/val_token_accuracy"] for s in (0, 1)) / 2
    )
    text = seqae("sweep", "status", name, "--workspace", str(workspace)).stdout
    assert re.search(
        r"best: trial \d.*val_token_accuracy 0\.\d{4} ± 0\.\d{4} \(s\.e\.; seeds 0: 0\.\d{4}, 1: 0\.\d{4}\)", text
    ), text
    built = seqae("report", name, "--workspace", str(workspace))
    assert built.returncode == 0, built.stderr[-3000:]
    page = (storage / "report" / "index.html").read_text()
    assert "val accuracy per seed" in page and re.search(r"<td>0: 0\.\d{4}, 1: 0\.\d{4}</td>", page)


# 2 -----------------------------------------------------------------------------------------
def test_ctrl_c_stops_cleanly_and_resume_goes_on(tmp_path):
    workspace, name = tmp_path / "ws", "ctrlc"
    storage = workspace / "sweeps" / name
    driver = start(*run_args(workspace, name, "trials.total=4", "train.epochs=4"), log=tmp_path / "driver.log")
    # a trial finished and another midway; held (below), it gets at most one epoch further
    wait_for(
        lambda: held(
            driver,
            lambda: (
                finished(storage)
                and any(1 <= m["epoch"] <= 2 and not m["finished"] for m in trial_metas(storage).values())
            ),
        ),
        300,
        "a trial finished and another midway",
        every=0.05,
    )
    os.kill(driver.pid, signal.SIGINT)  # Ctrl-C, handled once the driver goes on
    os.kill(driver.pid, signal.SIGCONT)
    assert driver.wait(timeout=180) == 130
    log = (tmp_path / "driver.log").read_text()
    assert "interrupted" in log and f"seqae sweep resume {name}" in log
    runs = mlflow_runs(workspace, name)
    assert "RUNNING" not in {r.info.status for r in runs}  # a clean stop leaves nothing open
    assert next(r for r in runs if r.data.tags.get("seqae.role") == "sweep").info.status == "KILLED"
    done_before = finished(storage)
    assert done_before  # so that "a finished trial is never re-run" below checks something

    resumed = seqae("sweep", "resume", name, "--workspace", str(workspace))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert_books_balanced(workspace, name, 4, epochs=4)
    results = tune_results(workspace, name)
    assert {int(trial.split("-")[1]) for trial in results} == set(range(4)), results  # Tune's layout was read
    for trial, sessions in results.items():
        epochs = [e for s in sessions for e in s]
        assert epochs == sorted(set(epochs)), (trial, sessions)  # no reported epoch goes backwards
        if int(trial.split("-")[1]) in done_before:
            assert len(sessions) == 1


# 4 -----------------------------------------------------------------------------------------
def test_damaged_newest_checkpoints_are_skipped_and_said(tmp_path):
    workspace, name = tmp_path / "ws", "damaged"
    storage = workspace / "sweeps" / name
    driver = start(
        *run_args(workspace, name, "trials.total=2", "train.epochs=8", "max_concurrent=2"), log=tmp_path / "driver.log"
    )
    # both past epoch 3 and two from their end: held (below), each gets at most one epoch further
    wait_for(
        lambda: held(
            driver,
            lambda: len([m for m in trial_metas(storage).values() if 3 <= m["epoch"] <= 6 and not m["finished"]]) == 2,
        ),
        300,
        "two trials past epoch 3",
        every=0.05,
    )
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    wait_for_writers_to_exit(storage)  # nothing writes the records this test damages
    # a: a trial still unfinished after its worker ended the epoch it was in (a finished trial's
    # newest record is not loaded again: the manifest says it finished)
    metas = trial_metas(storage)
    a = next(n for n, m in sorted(metas.items()) if not m["finished"])
    b = next(n for n in sorted(metas) if n != a)
    newest_a = Path(CheckpointStore.of_trial(str(storage), a).records()[-1])
    state = newest_a / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # truncated
    records_b = CheckpointStore.of_trial(str(storage), b).records()
    assert records_b
    for record in map(Path, records_b):
        (record / "manifest.json").write_text("{not json")  # every record of b garbled

    resumed = seqae("sweep", "resume", name, "--workspace", str(workspace))
    out = resumed.stdout
    assert resumed.returncode == 0, out[-3000:] + resumed.stderr[-3000:]
    epoch_a = int(newest_a.name.split("-")[1])
    assert f"trial {a}: skipped damaged checkpoint {newest_a.name}: state.pt has" in out
    assert f"trial {a}: continuing after epoch {epoch_a - 1}" in out
    assert f"trial {b}: skipped damaged checkpoint" in out and "unreadable" in out
    assert f"trial {b}: no valid checkpoint left; starting over from epoch 1" in out
    assert_books_balanced(workspace, name, 2, epochs=8)


# 6 -----------------------------------------------------------------------------------------
def test_a_raising_trial_and_a_nan_trial_fail_everywhere_and_the_sweep_goes_on(tmp_path, receiver):
    workspace, name = tmp_path / "ws", "failing"
    # lr 1e30 drives the loss to NaN; d_attn 24 with 16 heads is a combination no config allows
    extra = [
        "train.lr=0.001",
        "grid.train.lr=[1e30, 0.003]",
        "train.lr_schedule=constant",
        "trials={per_cell: 2}",
        "search.model.d_attn={type: categorical, choices: [16, 24]}",
        "search.model.heads={type: categorical, choices: [1, 16]}",
        "sampler={type: random, seed: 5}",
        "start={}",
        receiver.notify(),
    ]
    run = seqae(*run_args(workspace, name, *extra))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]  # the sweep completes
    trials = optuna_trials(workspace, name)
    assert len(trials) == 4  # Optuna kept sampling after failures
    runs = {int(r.data.tags["seqae.trial"]): r for r in children(mlflow_runs(workspace, name))}
    kinds = set()
    for trial in trials:
        p = trial.params
        invalid = p["model.d_attn"] % p["model.heads"] != 0
        expected = "invalid" if invalid else ("nan" if p["train.lr"] > 1 else "ok")
        kinds.add(expected)
        run_ = runs[trial.number]
        if expected == "ok":
            assert trial.state.name == "COMPLETE" and run_.info.status == "FINISHED"
            continue
        assert trial.state.name == "FAIL", (trial.number, p)
        assert run_.info.status == "FAILED" and run_.data.tags["seqae.outcome"] == "failed"
        error = run_.data.tags["seqae.error"]
        assert ("divisible by model.heads" in error) if invalid else ("NonFiniteLossError" in error), error
        tune_dir = next((workspace / "sweeps" / name / "tune").glob(f"session-*/trial-{trial.number:04d}"))
        assert (tune_dir / "error.txt").exists()  # ERROR in Tune too
    assert kinds == {"invalid", "nan", "ok"}, f"seed 5 should sample every outcome: {kinds}"
    failed = sorted(t.number for t in trials if t.state.name == "FAIL")  # each failure told once, with its error
    told = {m["title"]: m["message"] for m in receiver.received if m["title"].endswith(" failed")}
    assert sorted(told) == sorted(f"seqae {name}: trial {n} failed" for n in failed), receiver.titles()
    assert all("NonFiniteLossError" in m or "divisible by model.heads" in m for m in told.values()), told
    report = (workspace / "sweeps" / name / "report" / "index.html").read_text()
    assert '<tr class="failed">' in report


# 7 -----------------------------------------------------------------------------------------
def test_two_drivers_of_one_sweep_cannot_both_run(tmp_path):
    workspace, name = tmp_path / "ws", "twice"
    args = run_args(workspace, name, "trials.total=2", "train.epochs=4")
    first = start(*args, log=tmp_path / "first.log")
    wait_for(lambda: (workspace / "sweeps" / name / "sweep.json").exists(), 120, "the first driver to start")
    second = seqae(*args)  # the same run again
    assert second.returncode == 2 and "already exists" in second.stderr, second.stderr
    wait_for(lambda: "trials planned" in (tmp_path / "first.log").read_text(), 120, "the first driver to hold it")
    os.kill(first.pid, signal.SIGSTOP)  # held, so that it cannot finish before the resume below asks
    try:
        third = seqae("sweep", "resume", name, "--workspace", str(workspace))
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert third.returncode == 2 and "already running" in third.stderr, third.stderr
    assert first.wait(timeout=600) == 0
    assert_books_balanced(workspace, name, 2, epochs=4)


# 9 -----------------------------------------------------------------------------------------
def test_mlflow_outage_delays_tracking_but_loses_nothing(tmp_path):
    from cluster import mlflow_server
    from cluster.procs import stop_group

    workspace, name, port = tmp_path / "ws", "outage", free_port()
    backend, artifacts = f"sqlite:///{tmp_path / 'server.db'}", str(tmp_path / "server-artifacts")
    server = mlflow_server.start(backend, artifacts, port, tmp_path / "server.log")
    env = {"SEQAE_MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
    storage = workspace / "sweeps" / name
    # trials of 1,000 epochs train through the outage on any machine, until the test stops them
    driver = start(
        *run_args(workspace, name, "trials.total=2", "max_concurrent=2", "train.epochs=1000", "train.patience=1000"),
        log=tmp_path / "driver.log",
        env=env,
    )

    def trained() -> int:  # epochs checkpointed, both trials
        return sum(m["epoch"] for m in trial_metas(storage).values())

    try:
        wait_for(lambda: trained() >= 1, 300, "training to start")
        epochs_at_outage = trained()
        stop_group(server)  # MLflow goes away (at once; the wait for its process group may take seconds)
        wait_for(
            lambda: "MLflow unreachable while" in (tmp_path / "driver.log").read_text(),
            300,
            "the driver to meet the outage",
        )
        seen = time.time()  # the outage began at or before this
        wait_for(lambda: trained() >= epochs_at_outage + 2, 300, "training to go on without MLflow")
        server = mlflow_server.start(backend, artifacts, port, tmp_path / "server.log")  # back, same place
        back = time.time()  # the outage ended after this
        epochs_back = trained()
        wait_for(lambda: trained() >= epochs_back + 2, 300, "training to go on with MLflow back")
        Sweep.open(name, workspace).stop(now=True)
        assert driver.wait(timeout=600) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        kill_group(driver)
        stop_group(server)
    epochs = {n: m["epoch"] for n, m in trial_metas(storage).items()}
    assert len(epochs) == 2, epochs
    # read from the server's own database: starting it again only to read would cost a process start
    runs = mlflow_runs(None, name, tracking_uri=backend)  # stopped to continue: KILLED, as after Ctrl-C
    assert {r.info.status for r in runs} == {"KILLED"} and len(children(runs)) == 2
    for kid in children(runs):
        steps = metric_steps(kid.info.run_id, "val_token_accuracy", None, tracking_uri=backend)
        assert steps == list(range(1, epochs[int(kid.data.tags["seqae.trial"])] + 1)), steps
        points = metric_steps(kid.info.run_id, "train_loss_steps", None, tracking_uri=backend)
        assert points == list(range(3, int(kid.data.metrics["global_step"]) + 1, 3)), points  # each once
    parent = next(r for r in runs if r.data.tags.get("seqae.role") == "sweep")
    assert parent.data.metrics["mlflow_outage_seconds"] >= back - seen  # the gap is on record
    session = json.loads((storage / "sweep.json").read_text())["sessions"][-1]
    assert session["mlflow_outage_seconds"] >= back - seen and session["mlflow_writes_pending"] == 0


def test_a_driver_that_starts_while_mlflow_is_away_waits_for_it_then_says_so_in_one_line(tmp_path):
    """A driver cannot train before it has the sweep's experiment and parent run: it waits for the
    server like for the study's database (SEQAE_STORAGE_RETRY_SECONDS), then stops in one line with
    exit 75, creating nothing in MLflow; a resume that meets the outage rides it out and finishes."""
    from cluster import mlflow_server
    from cluster.procs import stop_group

    workspace, name, port = tmp_path / "ws", "away", free_port()
    backend, artifacts = f"sqlite:///{tmp_path / 'server.db'}", str(tmp_path / "server-artifacts")
    uri = f"http://127.0.0.1:{port}"
    env = {"SEQAE_MLFLOW_TRACKING_URI": uri}
    gave_up = seqae(
        *run_args(workspace, name, "trials.total=1", "train.epochs=2"), env={**env, "SEQAE_STORAGE_RETRY_SECONDS": "2"}
    )
    assert gave_up.returncode == 75, gave_up.stderr[-3000:]
    said = [line for line in gave_up.stderr.splitlines() if line.startswith("seqae: error:")]
    assert len(said) == 1 and "Traceback" not in gave_up.stderr, gave_up.stderr[-3000:]
    assert f"MLflow at {uri} did not answer" in said[0] and f"seqae sweep resume {name}" in said[0], said
    log = tmp_path / "resume.log"
    driver = start("sweep", "resume", name, "--workspace", str(workspace), log=log, env=env)
    server = None
    try:
        wait_for(
            lambda: "did not answer while opening the sweep's experiment" in log.read_text(),
            300,
            "the resumed driver to meet the outage",
        )
        server = mlflow_server.start(backend, artifacts, port, tmp_path / "server.log")
        assert driver.wait(timeout=600) == 0, log.read_text()[-3000:]
        runs = mlflow_runs(None, name, tracking_uri=uri)
        assert {r.info.status for r in runs} == {"FINISHED"} and len(children(runs)) == 1
        assert metric_steps(children(runs)[0].info.run_id, "val_token_accuracy", None, tracking_uri=uri) == [1, 2]
    finally:
        kill_group(driver)
        if server is not None:
            stop_group(server)


# 10: bad sweep files create nothing (test_spec.py) ----------------------------------------


# 11 ----------------------------------------------------------------------------------------
def test_resume_of_a_changed_sweep_file_is_refused_with_the_difference(tmp_path):
    workspace, study = tmp_path / "ws", tmp_path / "mine.yaml"
    shutil.copy(STUDIES / "quickstart.yaml", study)
    first = seqae(*run_args(workspace, "mine", "trials.total=1", "train.epochs=1", study=study))
    assert first.returncode == 0, first.stderr[-3000:]
    doc = yaml.safe_load(study.read_text())
    doc["sampler"]["seed"] = 7
    study.write_text(yaml.safe_dump(doc))
    resumed = seqae("sweep", "resume", "mine", "--workspace", str(workspace))
    assert resumed.returncode == 2
    assert "changed since sweep 'mine' started" in resumed.stderr
    assert re.search(r"^-\s+seed: 0$", resumed.stderr, re.M) and re.search(r"^\+\s+seed: 7$", resumed.stderr, re.M)


# 12, 13: names and links that could escape the workspace (test_workspace.py) ----------------


# 14 ----------------------------------------------------------------------------------------
def test_mlflow_server_refuses_foreign_hosts_and_cross_origin_writes(tmp_path):
    from cluster import mlflow_server
    from cluster.procs import stop_group

    port = free_port()
    server = mlflow_server.start(f"sqlite:///{tmp_path / 'db'}", str(tmp_path / "art"), port, tmp_path / "log")
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments"

    def status(path: str, headers: dict[str, str], body: dict | None = None) -> int:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{url}/{path}", data=data, headers={"Content-Type": "application/json", **headers}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    try:
        assert status("search?max_results=1", {}) == 200
        assert status("search?max_results=1", {"Host": "evil.example"}) == 403  # DNS rebinding
        assert status("search?max_results=1", {"Host": f"192.0.2.1:{port}"}) == 403
        assert status("create", {"Origin": "http://evil.example"}, {"name": "x"}) == 403  # cross-origin write
        assert status("create", {"Origin": f"http://127.0.0.1:{port}"}, {"name": "ok"}) == 200
        assert status("search?max_results=5", {}) == 200
    finally:
        stop_group(server)


# 15 ----------------------------------------------------------------------------------------
@pytest.fixture
def small_filesystem(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root (CI runs as root)")
    mount = tmp_path / "fs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_or_read_only_workspace_fails_clearly_and_keeps_data_readable(small_filesystem, tmp_path):
    workspace = small_filesystem / "ws"
    # every command in a process of its own, as a user's are: the remount below needs no file
    # left open on this filesystem by a command that ended
    first = seqae(*run_args(workspace, "before", "trials.total=1", "train.epochs=1"), fresh=True)
    assert first.returncode == 0, first.stderr[-3000:]

    def still_readable() -> None:
        info = seqae("sweep", "status", "before", "--json", "--workspace", str(workspace), fresh=True)
        assert info.returncode == 0, info.stderr
        assert json.loads(info.stdout)["trials_by_state"] == {"COMPLETE": 1}
        # a separate process, as a user's next command is: this one must hold no file open there
        read = subprocess.run(
            [
                sys.executable,
                "-c",
                (
                    "import json, sys; from tests.sweep_helpers import mlflow_runs, optuna_trials; from pathlib import Path; "
                    "w = Path(sys.argv[1]); print(json.dumps([sorted(r.info.status for r in mlflow_runs(w, 'before')), "
                    "[t.state.name for t in optuna_trials(w, 'before')]]))"
                ),
                str(workspace),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert read.returncode == 0, read.stderr[-2000:]
        assert json.loads(read.stdout.strip().splitlines()[-1]) == [["FINISHED", "FINISHED"], ["COMPLETE"]]

    filler = small_filesystem / "filler"
    with open(filler, "wb") as f, pytest.raises(OSError):
        while True:
            f.write(b"\0" * (1 << 20))
    full = seqae(*run_args(workspace, "after", "trials.total=1"), fresh=True)
    assert full.returncode == 2 and "is not writable" in full.stderr and "No space left" in full.stderr, full.stderr
    still_readable()

    filler.unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(small_filesystem)], check=True)
    read_only = seqae(*run_args(workspace, "after", "trials.total=1"), fresh=True)
    assert read_only.returncode == 2 and "Read-only file system" in read_only.stderr, read_only.stderr
    still_readable()
