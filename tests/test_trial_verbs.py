"""Hands on one trial: `seqae sweep stop NAME --trial N [--now]` and `seqae sweep retry NAME
[--trials N,M | --failed]`. The fast tests act on a real Optuna study (SQLite) of a sweep made by
the real `Sweep.create`, no Ray (the checks and records come before any driver); the slow one runs
a tiny sweep whose one trial fails, fixes the cause and retries it, and stops a running trial by hand."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from seqae import Sweep
from seqae.cli.main import main
from seqae_core import names as N
from seqae_core.records import TrialProgress
from seqae_errors import ConfigError
from sweeps.running import lifecycle
from sweeps.stores import ledger
from sweeps.stores.search import open_study, read_only
from sweeps.stores.search import storage as optuna_storage
from sweeps.stores.workspace import DriverLock, Workspace
from tests.conftest import WIKI_MINI
from tests.refusal import assert_refused
from tests.sweep_helpers import STUDIES, mlflow_runs, run_args, seqae, start, status, wait_for
from tests.test_ownership import as_user
from tests.test_troubleshooting import assert_quoted, printed

QUICKSTART = STUDIES / "quickstart.yaml"


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Workspace, str]:
    """Alice's sweep whose study holds trial 0 running and trial 1 failed, as a driver left them."""
    workspace = Workspace(tmp_path / "ws")
    workspace.root.mkdir()
    optuna_storage(f"sqlite:///{workspace.root / 'optuna.db'}")
    as_user(monkeypatch, "alice")
    name = Sweep.create(
        QUICKSTART, set=[f"data.path={WIKI_MINI}", "trials.total=4"], name="hers", workspace=workspace
    ).name
    state = workspace.read(name)
    study = open_study(state.spec, state.backends.optuna_storage, name, state.total_trials, state.fingerprint)
    first, second = study.next_trial(), study.next_trial()
    assert (first and first.number, second and second.number) == (0, 1)
    study.tell(1, TrialState.FAIL)
    return workspace, name


def study_of(workspace: Workspace, name: str):
    state = workspace.read(name)
    return read_only(state.spec, state.backends.optuna_storage, name)


def test_decide_prunes_a_trial_stopped_by_hand_as_a_scheduler_would():
    ran = TrialProgress(1.0, [{"epoch": 1}], finished=False)
    assert ledger.decide(ran, False, stopped=True) is ledger.Outcome.PRUNED
    assert ledger.decide(None, False, stopped=True) is ledger.Outcome.PRUNED  # before its first validation: not failed
    assert (
        ledger.decide(TrialProgress(3.0, [{"epoch": 3}], finished=True), False, stopped=True) is ledger.Outcome.COMPLETE
    )
    assert ledger.decide(ran, True, stopped=True) is ledger.Outcome.FAIL  # an error is an error
    assert ledger.decide(ran, False, halted=True, stopped=True) is ledger.Outcome.PRUNED  # not left to continue
    assert ledger.decide(None, False) is ledger.Outcome.FAIL


def test_stop_trial_is_recorded_on_the_running_trial_and_refused_for_an_unknown_finished_or_anothers_trial(
    sweep, monkeypatch, capsys
):
    workspace, name = sweep
    argv = ["sweep", "stop", name, "--workspace", str(workspace.root), "--trial"]
    trials = workspace.sweep_dir(name) / "trials"  # what a driver makes; a stop makes nothing but its record
    assert main([*argv, "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"sweep {name}: trial 0 stops at its next validation, keeping its record to there; it ends pruned"
    ), out
    assert "no driver runs the sweep now: its next resume records it" in out
    asked = study_of(workspace, name).stops_asked()
    assert list(asked) == [0] and asked[0].by == "alice" and asked[0].now is False
    assert study_of(workspace, name).control().drain is None  # the sweep goes on

    for number, refusal in (
        ("7", "--trial 7: sweep 'hers' has no trial 7 (its trials: 0 to 1)"),
        ("1", "--trial 1: trial 1 is FAIL, not running; there is nothing to stop"),
    ):
        assert_refused(main([*argv, number]), capsys.readouterr().err, refusal, created=(trials,))
    as_user(monkeypatch, "bob")
    assert_refused(
        main([*argv, "0", "--now"]),
        capsys.readouterr().err,
        "sweep 'hers' belongs to alice; bob may not stop it (an MLflow admin may)",
        created=(trials,),
    )
    assert study_of(workspace, name).stops_asked()[0].now is False  # bob's changed nothing

    # a driver that starts later ends it before any trial runs: pruned, without a checkpoint
    study = study_of(workspace, name)
    notes = ledger.reconcile_study(study, workspace.read(name).backends.storage)
    assert "trial 0: stopped by alice; recorded as pruned" in notes
    assert study.state(0) == TrialState.PRUNED


def test_retry_gives_a_failed_trial_a_new_attempt_under_its_number_linked_to_the_failed_one(sweep, monkeypatch, capsys):
    workspace, name = sweep
    state = workspace.read(name)
    with DriverLock(workspace.sweep_dir(name) / "driver.lock"):  # a driver runs it: refused, nothing changes
        with pytest.raises(ConfigError, match=f"sweep {name!r} is already running"):
            lifecycle.retry(workspace, name, None)
    for which, refusal in (
        ("0", "--trials='0': trial 0 is RUNNING; only failed trials are retried (failed: 1)"),
        ("9", "--trials='9': trial 9 is not in the sweep; only failed trials are retried (failed: 1)"),
        ("1;2", "--trials='1;2': give trial numbers separated by commas, e.g. 3,5"),
    ):
        with pytest.raises(ConfigError) as refused:
            lifecycle.retry(workspace, name, which)
        assert str(refused.value) == refusal
    as_user(monkeypatch, "bob")
    assert_refused(
        main(["sweep", "retry", name, "--failed", "--workspace", str(workspace.root)]),
        capsys.readouterr().err,
        "sweep 'hers' belongs to alice; bob may not retry it (an MLflow admin may)",
        created=(workspace.sweep_dir(name) / "trials",),
    )
    as_user(monkeypatch, "alice")
    assert_refused(  # the job that a retry submits for a sweep on a cluster runs `sweep run --or-resume --retry`
        main(
            ["sweep", "run", str(QUICKSTART), "--name", name, "--retry", "failed", "--workspace", str(workspace.root)]
        ),
        capsys.readouterr().err,
        "--retry failed: give --or-resume too; it retries failed trials of an existing sweep",
        created=(workspace.sweep_dir(name) / "trials",),
    )
    failed = study_of(workspace, name).trials()[1]

    assert lifecycle.retry(workspace, name, None) == [
        "trial 1: attempt 2, with its parameters, from scratch (the failed attempt kept no checkpoint)"
    ]
    study = study_of(workspace, name)
    trial = {t.number: t for t in study.trials()}[1]  # one trial, under its own number, as its newest record
    assert len(study.trials()) == 2 and trial.state == TrialState.RUNNING and trial.params == failed.params
    assert (trial.user_attrs[N.ATTEMPT], trial.user_attrs[N.RETRY_OF]) == (2, 1)
    records = optuna.load_study(study_name=name, storage=state.backends.optuna_storage).get_trials()
    assert [t.state for t in records] == [TrialState.RUNNING, TrialState.FAIL, TrialState.RUNNING]  # the failed stays
    assert study.remaining() == 2  # the next driver runs it, beside running trial 0
    with pytest.raises(ConfigError, match="--failed: sweep 'hers' has no failed trials") as refused:
        lifecycle.retry(workspace, name, None)
    assert_quoted(printed(refused.value).replace("'hers'", "'quickstart'"))  # docs/how-to/troubleshooting.md


def failing_then_fixed(storage: Path, number: int) -> Path:
    """Trial ``number``'s second epoch cannot be recorded (a file where its record's folder goes,
    as a full or broken disk would): it fails after its first checkpoint. Returns the file."""
    blocker = storage / "trials" / f"{number:04d}" / "epoch-000002"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("in the way")
    return blocker


@pytest.mark.slow
def test_a_failed_trial_fixed_and_retried_completes_linked_to_its_failed_attempt_and_counts_once(tmp_path):
    """A trial that failed at its second epoch is retried from its first epoch's checkpoint once
    its cause is gone: COMPLETE under its number, its failed attempt's record and run kept (with its
    error and code commit), the two linked; status, export and the report count it once."""
    workspace, name = tmp_path / "ws", "retried"
    blocker = failing_then_fixed(workspace / "sweeps" / name, 1)
    first = seqae(*run_args(workspace, name, "trials.total=2", "train.epochs=2"))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert status(name, workspace)["trials_by_state"] == {"COMPLETE": 1, "FAIL": 1}
    blocker.unlink()  # fixed

    retry = seqae("sweep", "retry", name, "--failed", "--workspace", str(workspace))
    assert retry.returncode == 0, retry.stdout[-3000:] + retry.stderr[-3000:]
    assert (
        "seqae: trial 1: attempt 2, with its parameters, from its checkpoint at epoch 1 (the failed attempt's "
        "last good one)"
    ) in retry.stdout, retry.stdout
    assert "was interrupted" not in retry.stdout and "closed as KILLED" not in retry.stdout, retry.stdout
    shown = status(name, workspace)
    assert shown["trials_by_state"] == {"COMPLETE": 2} and shown["attempts"] == {"1": 2}, shown
    records = optuna.load_study(study_name=name, storage=f"sqlite:///{workspace / 'optuna.db'}").get_trials()
    assert [(t.state.name, t.user_attrs.get(N.CONTINUES), t.user_attrs.get(N.RETRY_OF)) for t in records] == [
        ("COMPLETE", None, None),
        ("FAIL", None, None),
        ("COMPLETE", 1, 1),
    ]
    assert list(records[2].intermediate_values) == [1, 2]  # its first epoch as the failed attempt trained it

    runs = mlflow_runs(workspace, name)
    current = next(r for r in runs if r.data.tags.get(N.TRIAL) == "1")
    failed = next(r for r in runs if r.data.tags.get(N.ATTEMPT_OF) == "1")
    assert (current.info.status, current.data.tags[N.ATTEMPT], current.data.tags[N.RETRY_OF_RUN]) == (
        "FINISHED",
        "2",
        failed.info.run_id,
    )
    assert (failed.info.status, failed.data.tags[N.RETRIED_BY], failed.data.tags[N.ATTEMPT]) == (
        "FAILED",
        current.info.run_id,
        "1",
    )
    assert "epoch-000002" in failed.data.tags[N.ERROR]  # the failed attempt's error stays readable
    assert "mlflow.source.git.commit" in failed.data.tags and "mlflow.source.git.commit" in current.data.tags
    assert sum(N.TRIAL in r.data.tags for r in runs) == 2  # a run per configuration

    table = Sweep(name, workspace).trials().to_pandas()
    assert list(table.trial) == [0, 1] and list(table.attempts) == [1, 2] and list(table.state) == ["COMPLETE"] * 2
    report = (workspace / "sweeps" / name / "report" / "index.html").read_text()
    assert report.count("trial-0001-attempt-1") == 0  # the retired run is no trial of the report


@pytest.mark.slow
def test_stop_one_trial_by_hand_prunes_it_everywhere_and_the_sweep_starts_its_next_trial(tmp_path):
    """`seqae sweep stop NAME --trial 0` ends trial 0 at its next validation, PRUNED in Optuna and
    MLflow and TERMINATED in Tune, with its best checkpoint; its slot (max_concurrent=1) goes to trial 1."""
    workspace, name = tmp_path / "ws", "handstop"
    log = tmp_path / "driver.log"
    driver = start(
        *run_args(
            workspace,
            name,
            "trials.total=2",
            "max_concurrent=1",
            "train.epochs=1000",
            "train.patience=1000",
            "scheduler.type=none",
        ),
        log=log,
    )
    try:
        wait_for(lambda: "trial 0  epoch 1/" in log.read_text(), 180, "trial 0's first epoch")
        stopped = seqae("sweep", "stop", name, "--trial", "0", "--workspace", str(workspace))
        assert stopped.returncode == 0, stopped.stderr
        assert "trial 0 stops at its next validation" in stopped.stdout
        wait_for(lambda: "trial 1  epoch 1/" in log.read_text(), 180, "trial 1 in trial 0's slot")
        stopped = seqae("sweep", "stop", name, "--trial", "1", "--now", "--workspace", str(workspace))
        assert stopped.returncode == 0, stopped.stderr
        assert driver.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    text = log.read_text()
    assert "stopped by `seqae sweep stop --trial`" in text, text[-3000:]
    records = optuna.load_study(study_name=name, storage=f"sqlite:///{workspace / 'optuna.db'}").get_trials()
    assert [t.state.name for t in records] == ["PRUNED", "PRUNED"], text[-3000:]
    runs = {int(r.data.tags[N.TRIAL]): r for r in mlflow_runs(workspace, name) if N.TRIAL in r.data.tags}
    assert [(runs[n].info.status, runs[n].data.tags[N.OUTCOME]) for n in (0, 1)] == [("FINISHED", "pruned")] * 2
    results = sorted((workspace / "sweeps" / name / "tune").glob("session-*/trial-0000/result.json"))
    assert results and json.loads(results[0].read_text().splitlines()[-1])["epoch"] >= 1
    assert any((workspace / "sweeps" / name / "trials" / "0000").glob("best-*"))  # its best epoch's record stays
