"""A real local cluster: a Ray head and two worker raylets on loopback with token auth,
PostgreSQL and an MLflow server; sweeps submitted through the Jobs API."""

from __future__ import annotations

import contextlib
import getpass
import ipaddress
import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import optuna
import psutil
import pytest

from sweeps.stores.workspace import Workspace
from tests.conftest import REPO
from tests.rotation import in_turn
from tests.sweep_helpers import (
    SMOKE,
    STUDIES,
    drivers,
    finished,
    held,
    job_driver,
    kill_group,
    local_cluster,
    metric_steps,
    mlflow_runs,
    optuna_trials,
    python_page,
    seqae,
    sets,
    stacks,
    start,
    trial_metas,
    wait_for,
)

pytestmark = pytest.mark.slow

# two trials at once: the cluster runs them on different nodes
SWEEP = [*SMOKE, "data.input_len=16", "model.latent_len=8", "trials.total=4", "retries=2", "max_concurrent=2"]


# Secrets of the shell that starts the cluster, which no job may see, and a name it passes on purpose.
SHELL_SECRETS = {
    "HF_TOKEN": "hf_marker-of-the-starting-shell",
    "SSH_AUTH_SOCK": "/tmp/marker-of-the-starting-shell/agent",
}
PASSED = ("SITE_NOTE", "passed-on-purpose")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3):
    """Three nodes, each with its own data cache; every node, including a worker a test restarts,
    and this process reach the S3 server (``s3``) through the environment (``--pass-env``). This
    process has the MLflow admin's credentials in its environment, as a shell that sourced env.sh;
    the job drivers get them from the head's. The shell that starts it holds SHELL_SECRETS."""
    root = tmp_path_factory.mktemp("cluster")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {**s3, **SHELL_SECRETS, PASSED[0]: PASSED[1]}.items():
            mp.setenv(key, value)
        yield from local_cluster(root, pass_env=(PASSED[0],))


def submit(cluster, name: str, *extra: str, env: dict[str, str] | None = None, workspace: str | None = None) -> str:
    run = seqae(
        "sweep",
        "submit",
        str(STUDIES / "quickstart.yaml"),
        "--name",
        name,
        "--workspace",
        workspace or cluster["env"]["SEQAE_WORKSPACE"],
        *sets(*SWEEP, *extra),
        env={**cluster["env"], **(env or {})},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return re.search(r"as job (\S+)", run.stdout).group(1)


def job_status(cluster, name: str, workspace: str | None = None) -> dict:
    run = seqae(
        "sweep",
        "status",
        name,
        "--json",
        "--workspace",
        workspace or cluster["env"]["SEQAE_WORKSPACE"],
        env=cluster["env"],
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def wait_job(cluster, name: str, timeout: float = 600, workspace: str | None = None) -> dict:
    """The sweep's status through the command line once its latest job has ended. The job's state
    is polled from this process, through Ray's Jobs API: a `seqae sweep status` process every few
    seconds would take a core from the trials."""
    from ray.job_submission import JobSubmissionClient

    from sweeps.stores.workspace import Workspace

    record = Workspace(workspace or cluster["env"]["SEQAE_WORKSPACE"]).read_submission(name)
    assert record is not None, f"sweep {name} was not submitted"
    token = Path(cluster["state"].token_file).read_text().strip()
    jobs = JobSubmissionClient(record.address, headers={"Authorization": f"Bearer {token}"})
    wait_for(
        lambda: jobs.get_job_status(record.jobs[-1]).is_terminal(),
        timeout,
        f"job of sweep {name}",
        every=1,
        explain=lambda: "\n".join(stacks(p.pid) for p in drivers(name)) or f"no driver of sweep {name} runs",
    )
    return job_status(cluster, name, workspace)


def dashboard(cluster) -> str:
    return cluster["env"]["SEQAE_RAY_ADDRESS"]


# The tests below that meet one kind of fault each on this cluster, each with a sweep of its own: a
# commit runs one of them (tests/rotation.py), SEQAE_ROTATION=all every one.
FAULT_TESTS = ["lost-worker", "killed-worker", "torn-down", "postgresql-restart", "database-away"]


def test_cluster_is_three_nodes_with_loopback_services(cluster):
    run = seqae("cluster", "status", "--dir", str(cluster["root"]))
    info = json.loads(run.stdout)
    assert run.returncode == 0 and all(info["services"].values())
    assert sorted(n["ip"] for n in info["nodes"]) == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert all(n["state"] == "ALIVE" for n in info["nodes"])
    env = (cluster["root"] / "env.sh").read_text()
    logs = [p.read_text(errors="replace") for p in (cluster["root"] / "logs").iterdir()]
    for secret in secrets_of(cluster):
        for text in (env, run.stdout, *logs):
            assert secret not in text  # secrets stay in their files
    for path in (cluster["env"]["PGPASSFILE"], cluster["state"].mlflow.password_file):
        assert oct(Path(path).stat().st_mode)[-3:] == "600"


def test_a_job_sees_none_of_the_starting_shell_but_what_up_passed(cluster):
    """A Ray job may run any command; one that reads its environment here, in its driver on the
    head and in a task on a worker node: the Hugging Face token and the SSH agent of the shell that
    ran `cluster up` reach neither, the name `up --pass-env` gave does (and the S3 keys the tests
    pass). It prints the names it sees and the values of those two alone: the head holds the
    MLflow admin's password, which no log may show (test_submitted_sweep_runs_on_...)."""
    import shlex

    from ray.job_submission import JobSubmissionClient

    script = (
        "import json, os, ray\n"
        f"markers, shown = {list(SHELL_SECRETS.values())!r}, {[PASSED[0], 'AWS_ACCESS_KEY_ID']!r}\n"
        "def seen():\n"
        "    return {'names': sorted(os.environ), 'values': {k: os.environ.get(k) for k in shown},\n"
        "            'marked': sorted(k for k, v in os.environ.items() if any(m in v for m in markers))}\n"
        "ray.init()\n"
        "print(json.dumps({'head': seen(), 'worker': ray.get(ray.remote(num_cpus=1)(seen).remote())}))\n"
    )
    token = Path(cluster["state"].token_file).read_text().strip()
    jobs = JobSubmissionClient(dashboard(cluster), headers={"Authorization": f"Bearer {token}"})
    job = jobs.submit_job(entrypoint=shlex.join(["python", "-c", script]))
    wait_for(lambda: jobs.get_job_status(job).is_terminal(), 180, "the job printing its environment", every=1)
    logs = jobs.get_job_logs(job)
    assert jobs.get_job_status(job).value == "SUCCEEDED", logs[-4000:]
    seen = json.loads(next(line for line in reversed(logs.splitlines()) if line.startswith("{")))
    for where, env in seen.items():
        assert not SHELL_SECRETS.keys() & set(env["names"]) and env["marked"] == [], (where, env)
        assert env["values"] == {PASSED[0]: PASSED[1], "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"]}, where


def test_a_pass_env_name_the_shell_does_not_set_is_refused_before_anything_starts(tmp_path):
    root = tmp_path / "c"
    run = seqae("cluster", "up", "--dir", str(root), "--pass-env", "SEQAE_TEST_UNSET", unset=("SEQAE_TEST_UNSET",))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--pass-env SEQAE_TEST_UNSET: SEQAE_TEST_UNSET is not set in this shell" in run.stderr
    assert not root.exists()


def secrets_of(cluster) -> list[str]:
    """The Ray token, the database password and the MLflow admin's password."""
    return [
        Path(cluster["state"].token_file).read_text().strip(),
        Path(cluster["env"]["PGPASSFILE"]).read_text().split(":")[-1].strip(),
        Path(cluster["state"].mlflow.password_file).read_text().strip(),
    ]


def test_submitted_sweep_runs_on_several_nodes_and_tracks_in_postgres(cluster):
    """Submitted from a laptop's own workspace: `status` there shows the job and the trials, which
    the driver keeps in the cluster's workspace and backends."""
    laptop = str(cluster["root"] / "laptop")
    job = submit(cluster, "spread", workspace=laptop)
    info = wait_job(cluster, "spread", workspace=laptop)
    assert info["job"]["status"] == "SUCCEEDED", seqae(
        "sweep", "logs", "spread", "--workspace", laptop, env=cluster["env"]
    ).stdout[-4000:]
    assert info["trials_by_state"] == {"COMPLETE": 4} and info["outcome"] == "complete"
    assert info["best"]["trial"] in range(4) and info["mlflow_experiment_id"] is not None
    assert set(info["cost"]["per_trial_seconds"]) == {"0", "1", "2", "3"}
    text = seqae("sweep", "status", "spread", "--workspace", laptop, env=cluster["env"]).stdout
    assert "COMPLETE 4" in text and "job: " in text and "SUCCEEDED" in text, text

    # the sweep is its submitter's (the driver ran as the head's user): another user may neither stop
    # nor cancel it, and is told whose it is before the study or the cluster is changed
    owner = cluster["env"].get("MLFLOW_TRACKING_USERNAME") or getpass.getuser()
    assert info["owner"] == owner and f"owner: {owner}" in text, text
    for verb in ("stop", "cancel"):
        run = seqae(
            "sweep", verb, "spread", "--workspace", laptop, env={**cluster["env"], "MLFLOW_TRACKING_USERNAME": "bob"}
        )
        assert run.returncode == 2 and f"sweep 'spread' belongs to {owner}; bob may not {verb} it" in run.stderr, (
            run.stderr
        )

    runs = mlflow_runs(None, "spread", tracking_uri=cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"])
    parents = [r for r in runs if r.data.tags.get("seqae.role") == "sweep"]
    children = [r for r in runs if "seqae.trial" in r.data.tags]
    assert len(parents) == 1 and len(children) == 4
    assert info["mlflow_parent_run_id"] == parents[0].info.run_id  # status leads to the sweep's run

    # `stop` and `set` from another directory, in a shell that names no Optuna storage: the
    # submission record says where the sweep's study is and where its file was packaged from
    elsewhere = cluster["root"] / "elsewhere"
    elsewhere.mkdir()
    for verb in (["set", "spread", "max_concurrent=3"], ["stop", "spread"]):
        run = seqae(
            "sweep", *verb, "--workspace", laptop, env=cluster["env"], cwd=elsewhere, unset=("SEQAE_OPTUNA_STORAGE",)
        )
        assert run.returncode == 0, run.stdout + run.stderr
    control = job_status(cluster, "spread", workspace=laptop)["control"]
    assert control["max_concurrent"] == 3 and "with `seqae sweep stop`" in control["drain"], control
    assert {r.info.status for r in runs} == {"FINISHED"}
    nodes = {r.data.tags["ray.node_id"] for r in children}
    assert len(nodes) > 1, nodes  # the trials ran on more than one node
    assert {r.data.tags["ray.node_ip"] for r in children} <= {"127.0.0.3", "127.0.0.4"}

    storage = cluster["env"]["SEQAE_OPTUNA_STORAGE"]
    assert storage.startswith("postgresql+psycopg://")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PGPASSFILE", cluster["env"]["PGPASSFILE"])
        trials = optuna_trials(None, "spread", storage=storage)
        assert optuna.load_study(study_name="spread", storage=storage).user_attrs["seqae.owner"] == owner
    assert len(trials) == 4 and {t.state.name for t in trials} == {"COMPLETE"}
    assert {r.data.tags["seqae.owner"] for r in runs} == {owner}

    # MLflow's authentication was on: the driver tracked with the head's credentials, and a client
    # without them reads nothing of the sweep
    url = f"{cluster['env']['SEQAE_MLFLOW_TRACKING_URI']}/api/2.0/mlflow/experiments/get-by-name?experiment_name=spread"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 401

    # no secret reached the runs' params, the job's output or its runtime environment
    logs = seqae("sweep", "logs", "spread", "--workspace", laptop, env=cluster["env"]).stdout
    token = Path(cluster["state"].token_file).read_text().strip()
    request = urllib.request.Request(
        f"{dashboard(cluster)}/api/jobs/{job}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        job_info = json.loads(response.read())
    job_env = job_info["runtime_env"]["env_vars"]
    assert job_info["metadata"] == {"seqae_sweep": "spread", "seqae_user": owner, "seqae_owner": owner}
    assert job_env["SEQAE_USER"] == owner  # whom the driver acts for
    assert not any(k.startswith("MLFLOW_TRACKING_") for k in job_env), sorted(job_env)
    ray_logs = [p for p in Path(cluster["state"].ray_temp_dir).glob("session_*/logs/**/*") if p.is_file()]
    assert any("driver" in p.name for p in ray_logs)  # the job driver's own log is among them
    for secret in secrets_of(cluster):
        for run in runs:
            values = " ".join(f"{k}={v}" for k, v in {**run.data.params, **run.data.tags}.items())
            assert secret not in values
        assert secret not in logs and secret not in json.dumps(job_env)
        assert not [p for p in ray_logs if secret.encode() in p.read_bytes()]  # nor any of Ray's logs

    delete_then_gc(cluster, "spread", laptop, info["mlflow_experiment_id"], storage)


# MLflow's tables that hold a sweep's rows, and the columns that name its experiment, runs, logged
# models and dataset links
MLFLOW_TABLES = {
    "experiments": ("experiment_id",),
    "experiment_tags": ("experiment_id",),
    "runs": ("run_uuid",),
    "metrics": ("run_uuid",),
    "latest_metrics": ("run_uuid",),
    "params": ("run_uuid",),
    "tags": ("run_uuid",),
    "inputs": ("source_id", "destination_id"),
    "input_tags": ("input_uuid",),
    "logged_models": ("model_id", "experiment_id"),
}


def delete_then_gc(cluster, name: str, workspace: str, experiment_id: str, optuna_storage: str) -> None:
    """The sweep's user deletes it (`--models`: its registered version too): the artifacts go
    through the server, the rows stay marked deleted and the delete says so; the cluster's admin's
    `seqae cluster gc` then purges them: no row of MLflow's tables names it, no artifact file of it
    is left, its study is gone."""
    import sqlalchemy as sa

    from cluster import artifact_store

    pg = postgres_of(cluster)
    engine = sa.create_engine(pg.url("mlflow"), connect_args={"passfile": pg.pgpass_of("mlflow")})

    def rows(ids: set[str]) -> dict[str, int]:
        with engine.connect() as db:
            return {
                table: db.execute(
                    sa.text(
                        f"SELECT count(*) FROM {table} WHERE "  # noqa: S608 - names are ours
                        + " OR ".join(f"{c}::text = ANY(:ids)" for c in columns)
                    ),
                    {"ids": sorted(ids)},
                ).scalar_one()
                for table, columns in MLFLOW_TABLES.items()
            }

    with engine.connect() as db:
        ids = {
            experiment_id,
            *db.execute(
                sa.text("SELECT run_uuid FROM runs WHERE experiment_id = :e"), {"e": int(experiment_id)}
            ).scalars(),
            *db.execute(
                sa.text("SELECT model_id FROM logged_models WHERE experiment_id = :e"), {"e": int(experiment_id)}
            ).scalars(),
        }
        ids |= set(
            db.execute(
                sa.text("SELECT input_uuid FROM inputs WHERE destination_id = ANY(:ids) OR source_id = ANY(:ids)"),
                {"ids": sorted(ids)},
            ).scalars()
        )
    before = rows(ids)
    artifacts = Path(artifact_store.artifact_root(cluster["env"]["SEQAE_STORAGE"])) / experiment_id
    assert all(before[t] for t in ("runs", "metrics", "params", "tags", "experiments", "logged_models")), before
    assert any(p.is_file() for p in artifacts.rglob("*"))

    deleted = seqae("sweep", "delete", name, "--models", "--workspace", workspace, env=cluster["env"])
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    print(deleted.stdout)
    assert "stay marked deleted" in deleted.stdout and "`seqae cluster gc`" in deleted.stdout, deleted.stdout
    assert not [p for p in artifacts.rglob("*") if p.is_file()]  # through the server, at once
    assert rows(ids)["runs"] == before["runs"]  # marked deleted, for the admin

    purged = seqae("cluster", "gc", "--dir", str(cluster["root"]), unset=("PGPASSFILE", "MLFLOW_TRACKING_PASSWORD"))
    assert purged.returncode == 0, purged.stdout + purged.stderr
    print(purged.stdout)
    assert rows(ids) == dict.fromkeys(MLFLOW_TABLES, 0), rows(ids)
    assert f"runs           {before['runs']}" in purged.stdout and "experiments    1" in purged.stdout, purged.stdout
    assert not [p for p in artifacts.rglob("*") if p.is_file()]
    engine.dispose()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PGPASSFILE", cluster["env"]["PGPASSFILE"])
        assert name not in optuna.get_all_study_names(optuna_storage)


def test_a_submitted_sweep_goes_on_after_its_code_changed_only_with_consent(cluster, tmp_path):
    """An upgrade (issue 79): a sweep submitted from a clone is stopped after its first trial, then a
    commit changes its code. `resume` submits a job that refuses, in its logs, naming the file and
    the command; `resume --allow-code-change` submits one that goes on: every trial once, the change
    in the study's log. `extend` of a submitted sweep is refused, saying where it works."""
    clone, name, n = tmp_path / "clone", "upgrade", 2
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    workspace = cluster["env"]["SEQAE_WORKSPACE"]
    run = seqae(
        "sweep",
        "submit",
        "sweeps/studies/quickstart.yaml",
        "--name",
        name,
        "--workspace",
        workspace,
        *sets(*SWEEP, f"trials.total={n}", "max_concurrent=1"),
        env=cluster["env"],
        cwd=clone,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    storage, driver = Path(cluster["env"]["SEQAE_STORAGE"]) / name, job_driver(name)
    # held while the stop is written: no trial ends or starts meanwhile, so one is left to run
    wait_for(lambda: held(driver, lambda: finished(storage)), 400, "the first trial finished, held", every=0.1)
    try:
        stopped = seqae("sweep", "stop", name, "--workspace", workspace, env=cluster["env"])
        assert stopped.returncode == 0, stopped.stderr
    finally:
        driver.send_signal(signal.SIGCONT)
    info = wait_job(cluster, name)
    assert info["job"]["status"] == "SUCCEEDED" and info["outcome"] == "stopped", info
    assert 0 < info["trials_by_state"]["COMPLETE"] < n, info

    runner = clone / "sweeps" / "running" / "runner.py"
    runner.write_text(runner.read_text() + "\n# a change between sessions\n")
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "an upgrade"], cwd=clone, check=True
    )
    for consent in ([], ["--allow-code-change"]):
        resumed = seqae("sweep", "resume", name, "--workspace", workspace, *consent, env=cluster["env"], cwd=clone)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr  # submitted; its driver decides
        info = wait_job(cluster, name)
        logs = seqae("sweep", "logs", name, "--workspace", workspace, env=cluster["env"]).stdout
        if not consent:
            assert info["job"]["status"] == "FAILED", logs[-4000:]
            assert "its code changed since its last session (1 file: sweeps/running/runner.py)" in logs, logs[-4000:]
            assert f"`seqae sweep resume {name} --allow-code-change`" in logs
    assert info["job"]["status"] == "SUCCEEDED" and len(info["job"]["jobs"]) == 3, logs[-4000:]
    assert info["trials_by_state"] == {"COMPLETE": n} and info["outcome"] == "complete"
    assert [e["code_change"] for e in info["control"]["log"] if "code_change" in e] == [
        "1 file: sweeps/running/runner.py"
    ]
    assert_each_trial_once(cluster, name, n, 2)

    extended = seqae("sweep", "extend", name, "--trials", "1", "--workspace", workspace, env=cluster["env"])
    assert extended.returncode == 2 and "runs on a cluster as Ray jobs" in extended.stderr, extended.stderr[-2000:]


def test_a_submitted_sweeps_failed_trial_is_retried_by_a_new_job_from_the_submitting_shell(cluster):
    """Issue 84's retry of a sweep on a cluster: trial 1 fails at its second epoch (a file stands
    where that checkpoint goes); a retry naming a trial that did not fail is refused here, before
    a job is submitted; the cause removed, `retry --failed` from the submitting shell submits a new
    job of the sweep whose driver retries it from its first epoch's checkpoint: both trials end
    COMPLETE, trial 1 after 2 attempts, its failed attempt's Optuna record kept."""
    name, workspace = "retried", cluster["env"]["SEQAE_WORKSPACE"]
    blocker = Path(cluster["env"]["SEQAE_STORAGE"]) / name / "trials" / "0001" / "epoch-000002"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("in the way")
    submit(cluster, name, "trials.total=2", "retries=0")
    info = wait_job(cluster, name)
    assert info["job"]["status"] == "SUCCEEDED" and info["trials_by_state"] == {"COMPLETE": 1, "FAIL": 1}, info

    refused = seqae("sweep", "retry", name, "--trials", "0", "--workspace", workspace, env=cluster["env"])
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "trial 0 is COMPLETE; only failed trials are retried (failed: 1)" in refused.stderr, refused.stderr
    assert len(job_status(cluster, name)["job"]["jobs"]) == 1  # nothing submitted

    blocker.unlink()  # the cause, fixed
    retried = seqae("sweep", "retry", name, "--failed", "--workspace", workspace, env=cluster["env"])
    assert retried.returncode == 0 and f"submitted sweep {name!r} as job" in retried.stdout, retried.stderr
    info = wait_job(cluster, name)
    logs = seqae("sweep", "logs", name, "--workspace", workspace, env=cluster["env"]).stdout
    assert info["job"]["status"] == "SUCCEEDED" and len(info["job"]["jobs"]) == 2, logs[-4000:]
    assert info["trials_by_state"] == {"COMPLETE": 2} and info["attempts"] == {"1": 2}, info
    assert "trial 1: attempt 2, with its parameters, from its checkpoint at epoch 1" in logs, logs[-4000:]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PGPASSFILE", cluster["env"]["PGPASSFILE"])
        records = optuna_trials(None, name, cluster["env"]["SEQAE_OPTUNA_STORAGE"])
    assert sorted(t.state.name for t in records) == ["COMPLETE", "COMPLETE", "FAIL"], records


def test_the_python_pages_cluster_part_submits_follows_and_cancels_a_sweep(cluster, monkeypatch):
    """docs/how-to/python.md's "On a Ray cluster", as written, in a shell that sourced env.sh."""
    for key, value in cluster["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(REPO)
    page: dict[str, object] = {}
    exec(compile(python_page(True, SWEEP), "python.md", "exec"), page)
    sweep = page["sweep"]
    wait_for(lambda: sweep.job().status in ("STOPPED", "SUCCEEDED", "FAILED"), 120, "the cancelled job", every=1)
    job = sweep.job()
    assert job.status == "STOPPED", (job, sweep.logs()[-4000:])  # cancelled while it ran
    view = page["view"]  # watched while it ran, from this shell, whose workspace holds no sweep.json
    assert view.heading.startswith("sweep on-the-cluster: job RUNNING, ") and not view.ended, view.text()
    assert "trials (" in view.heading or "its driver has not created its study yet" in view.heading, view.text()
    assert job.jobs == (job.id,) and job.dashboard.endswith(f"/#/jobs/{job.id}") and sweep.submission is not None
    assert isinstance(sweep.logs(), str)


def test_jobs_api_refuses_requests_without_the_token(cluster):
    url = f"{dashboard(cluster)}/api/jobs/"
    token = Path(cluster["state"].token_file).read_text().strip()

    def job_ids() -> set[str]:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return {j["submission_id"] for j in json.loads(response.read())}

    before = job_ids()
    body = json.dumps({"entrypoint": "echo pwned", "submission_id": "intruder"}).encode()
    codes = {}
    for label, headers in (("none", {}), ("wrong", {"Authorization": "Bearer not-the-token"})):
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json", **headers}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        codes[label] = refused.value.code
    # Ray answers 401 when the token is missing and 403 when it is wrong: both are refusals.
    assert codes == {"none": 401, "wrong": 403}
    assert job_ids() == before and "intruder" not in job_ids()


def test_dashboard_and_mlflow_listen_on_loopback_only(cluster):
    addresses = _non_loopback_addresses()
    assert addresses, "this machine should have a non-loopback address to test against"
    ports = {
        "dashboard": int(dashboard(cluster).rsplit(":", 1)[1]),
        "mlflow": int(cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"].rsplit(":", 1)[1]),
        "postgres": cluster["state"].postgres.port,
    }
    import socket

    for port in ports.values():
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            pass  # reachable on loopback
        for address in addresses:
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=3).close()


def test_every_port_of_the_cluster_listens_on_loopback_only(cluster):
    """Each TCP port a process of the cluster listens on (Ray's GCS, raylets, object managers,
    dashboard and its agents, runtime-env agents, client server and worker processes; the MLflow
    server; PostgreSQL) is bound to a loopback address and refused on this machine's other
    addresses, but for those Ray binds to every interface wherever a node's address is not
    127.0.0.1 itself, with no option to bind them elsewhere (docs/tutorial/cluster.md): its gRPC
    servers, which ask for the cluster's token, and the head's two Prometheus endpoints (the
    dashboard's and the autoscaler's metrics). Any other port listening widely fails the test."""
    from ray.autoscaler._private.constants import AUTOSCALER_METRIC_PORT
    from ray.dashboard.consts import DASHBOARD_METRIC_PORT

    from cluster import local

    state = cluster["state"]
    procs = {p.pid: p for p in local.ray_processes(state.ray_temp_dir, state.ray_sessions)}
    postmaster = int(Path(state.postgres.data_dir, "postmaster.pid").read_text().split()[0])
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.NoSuchProcess):
            if os.getpgid(proc.pid) == state.pids["mlflow"] or proc.pid == postmaster:
                procs[proc.pid] = proc
    listening: dict[tuple[str, int], str] = {}
    for proc in procs.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            name = " ".join(proc.cmdline())[:100]
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    listening[(conn.laddr.ip, conn.laddr.port)] = name
    ports = {port for _, port in listening}
    # the ports the cluster's own addresses name are among them: the search found its processes
    assert {
        state.gcs_port,
        state.dashboard_port,
        state.mlflow.port,
        state.postgres.port,
        state.node_ports,
        state.node_ports + local.NODE_PORTS,
    } <= ports, listening
    # the GCS; each node's raylet, object manager, agent's gRPC port and workers; the head's metrics
    unbindable = {state.gcs_port, DASHBOARD_METRIC_PORT, AUTOSCALER_METRIC_PORT}
    for node in range(state.workers + 1):
        base = state.node_ports + local.NODE_PORTS * node
        unbindable |= {base, base + 1, base + 3, *range(base + 10, base + local.NODE_PORTS - 1)}
    wide = {(ip, port): name for (ip, port), name in listening.items() if not _loopback(ip)}
    assert not {port for _, port in wide} - unbindable, "\n".join(
        f"{ip}:{port} {name}" for (ip, port), name in sorted(wide.items()) if port not in unbindable
    )
    import socket

    addresses = _non_loopback_addresses()
    assert addresses, "this machine should have a non-loopback address to test against"
    for port in ports - {port for _, port in wide}:
        for address in addresses:
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=3).close()


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback  # ::ffff:127.0.0.2 too


def _non_loopback_addresses() -> list[str]:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    return [m for m in re.findall(r"inet (\d+\.\d+\.\d+\.\d+)", out) if not m.startswith("127.")]


def test_sqlite_backends_are_refused_for_multi_node_sweeps(cluster, tmp_path):
    env = {**cluster["env"], "SEQAE_MLFLOW_TRACKING_URI": "", "SEQAE_OPTUNA_STORAGE": ""}
    run = seqae(
        "sweep",
        "submit",
        str(STUDIES / "quickstart.yaml"),
        "--name",
        "lite",
        "--workspace",
        str(tmp_path / "ws"),
        *sets(*SWEEP),
        env=env,
    )
    assert run.returncode == 2 and "SQLite" in run.stderr
    assert not (tmp_path / "ws").exists()
    # A driver that joins the cluster itself refuses too, before creating anything.
    gcs = f"127.0.0.2:{cluster['state'].gcs_port}"
    run = seqae(
        "sweep",
        "run",
        str(STUDIES / "quickstart.yaml"),
        "--name",
        "lite",
        "--workspace",
        str(tmp_path / "ws2"),
        *sets(*SWEEP),
        env={
            "RAY_ADDRESS": gcs,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": cluster["state"].token_file,
            "SEQAE_MLFLOW_TRACKING_URI": "",
            "SEQAE_OPTUNA_STORAGE": "",
        },
    )
    assert run.returncode == 2 and "3 nodes" in run.stderr and "SQLite" in run.stderr, run.stderr[-2000:]
    assert not (tmp_path / "ws2" / "sweeps").exists()


def test_a_job_gets_only_the_projects_tracked_files_and_no_secret_reaches_its_command_line_env_logs_or_records(
    cluster, tmp_path, receiver
):
    """Submitted from a clone with an untracked `.env` and key file beside the code, a `--set`
    value, and a notification URL holding a secret both in SEQAE_NOTIFY_URLS and in a private file
    the sweep names (`file:/PATH`): the files never reach the cluster (Ray unpacks a job's package
    under its temp folder's runtime_resources); the setting is on no command line and not in the
    job's info; the secret is nowhere: not in the Jobs API's job info or logs, any process's
    command line, the driver's environment, Ray's logs, the sweep's folder (sweep.json, the
    report) or MLflow's params and tags; and the notifications still arrive, through the file."""
    from ray.job_submission import JobSubmissionClient

    # made here, so that no tracked file (this one is packaged too) holds them
    clone, planted, setting, secret = (
        tmp_path / "clone",
        *(f"{kind}-{uuid.uuid4().hex}" for kind in ("planted", "setting", "secret")),
    )
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    (clone / ".env").write_text(f"API_KEY={planted}\n")
    (clone / "id_rsa.pem").write_text(f"-----BEGIN KEY-----\n{planted}\n")
    url_file = tmp_path / "notify-url"
    url_file.write_text(f"{receiver.url}-{secret}")  # the receiver takes any path
    url_file.chmod(0o600)
    workspace = str(tmp_path / "ws")
    run = seqae(
        "sweep",
        "submit",
        "sweeps/studies/quickstart.yaml",
        "--name",
        "packaged",
        "--workspace",
        workspace,
        *sets(*SWEEP, "trials.total=2", f"description={setting}", f"notify={{urls: ['file:{url_file}']}}"),
        cwd=clone,
        env={**cluster["env"], "SEQAE_NOTIFY_URLS": f"json://127.0.0.1:9/{secret}"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"package: \d+ files, [\d.]+ [KM]iB", run.stdout), run.stdout
    assert "SEQAE_NOTIFY_URLS is not passed to the job" in run.stderr

    driver = job_driver("packaged")  # the job is up: its package unpacked, its driver started
    lines = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
    assert any("--sets-file" in line for line in lines)  # the driver's line, read while it runs
    assert not [line for line in lines if setting in line or secret in line]
    assert secret not in "\0".join(driver.environ().values())
    record = Workspace(workspace).read_submission("packaged")
    token = Path(cluster["state"].token_file).read_text().strip()
    jobs = JobSubmissionClient(record.address, headers={"Authorization": f"Bearer {token}"})
    info = jobs.get_job_info(record.jobs[-1]).model_dump_json()
    assert "--sets-file" in info and setting not in info and secret not in info

    sessions = list(Path(cluster["state"].ray_temp_dir).glob("session_2*"))
    unpacked = [p for session in sessions for p in (session / "runtime_resources").rglob("*")]
    assert any(p.match("*/seqae/__main__.py") for p in unpacked)  # the package is there
    assert not [p for p in unpacked if p.name in (".env", "id_rsa.pem")]
    assert not [p for p in unpacked if p.is_file() and planted.encode() in p.read_bytes()]

    info = wait_job(cluster, "packaged", workspace=workspace)
    assert info["job"]["status"] == "SUCCEEDED" and info["trials_by_state"] == {"COMPLETE": 2}  # its --set arrived
    assert "seqae packaged: the sweep is complete" in receiver.titles()  # the URL read from its file
    logs = jobs.get_job_logs(record.jobs[-1])
    assert "sweep packaged: complete" in logs and secret not in logs
    ray_logs = [p for session in sessions for p in (session / "logs").rglob("*") if p.is_file()]
    sweep_files = [p for p in (Path(record.workspace) / "sweeps" / "packaged").rglob("*") if p.is_file()]
    assert any(p.name == "sweep.json" for p in sweep_files) and ray_logs
    assert not [p for p in ray_logs + sweep_files if secret.encode() in p.read_bytes()]
    runs = mlflow_runs(None, "packaged", tracking_uri=cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"])
    recorded = [v for r in runs for v in (*r.data.params.values(), *r.data.tags.values())]
    assert any(str(url_file) in v for v in recorded)  # the reference, logged as the param sweep.notify
    assert not [v for v in recorded if secret in v]


def restore_worker(cluster, node_ip: str) -> None:
    from cluster import local

    local.start_worker(cluster["state"], int(node_ip.rsplit(".", 1)[1]) - 2)
    wait_for(lambda: node_ip in local.worker_raylets(cluster["state"]), 60, f"worker {node_ip} to come back")


def kill_worker_mid_trial(cluster, name: str, epochs: Callable[[], dict[int, int]], last: int) -> tuple[int, str]:
    """SIGKILL the worker node of a trial past its second epoch and two from its ``last``, with the
    sweep's driver held (sweep_helpers.held) so that it stays unfinished; returns the trial's number
    and its node's IP. ``epochs()``: each trial's newest checkpointed epoch."""
    from cluster import local

    def midway() -> int | None:
        return next((n for n, e in epochs().items() if 2 <= e <= last - 2), None)

    driver, ips, picked = job_driver(name), {}, []

    def known_midway() -> bool:
        picked[:] = [n for n in [midway()] if n in ips]  # the trial checked while held: re-read, it may be an epoch on
        return bool(picked)

    def ready() -> bool:
        if (
            number := midway()
        ) is not None and number not in ips:  # its node from MLflow, while the driver's writer runs
            ips[number] = _trial_node_ip(cluster, name, number)
        return held(driver, known_midway)

    wait_for(ready, 300, "a trial past epoch 2, held", every=0.1)
    number = picked[0]
    try:
        os.kill(local.worker_raylets(cluster["state"])[ips[number]], signal.SIGKILL)
    finally:
        driver.send_signal(signal.SIGCONT)
    return number, ips[number]


@in_turn("lost-worker", FAULT_TESTS)
def test_lost_worker_with_no_retries_left_fails_its_trial_everywhere(cluster):
    """Scenario 3, retries exhausted: the trial is FAILED in Tune, Optuna and MLflow; the rest finish."""
    name = "noretry"
    submit(cluster, name, "train.epochs=6", "trials.total=3", "retries=0")
    storage = Path(cluster["env"]["SEQAE_STORAGE"]) / name
    number, node_ip = kill_worker_mid_trial(
        cluster, name, lambda: {n: m["epoch"] for n, m in trial_metas(storage).items()}, 6
    )
    try:
        info = wait_job(cluster, name)
        logs = seqae("sweep", "logs", name, "--workspace", cluster["env"]["SEQAE_WORKSPACE"], env=cluster["env"]).stdout
        assert info["job"]["status"] == "SUCCEEDED", logs[-4000:]  # the sweep finished the rest
        assert info["trials_by_state"] == {"COMPLETE": 2, "FAIL": 1}, info
        assert re.search(rf"trial {number}  failed after \d+ epochs?: ", logs)  # ERROR in Tune, as the driver said
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PGPASSFILE", cluster["env"]["PGPASSFILE"])
            states = {t.number: t.state.name for t in optuna_trials(None, name, cluster["env"]["SEQAE_OPTUNA_STORAGE"])}
        assert states[number] == "FAIL"
        runs = mlflow_runs(None, name, tracking_uri=cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"])
        lost = next(r for r in runs if r.data.tags.get("seqae.trial") == str(number))
        assert lost.info.status == "FAILED", lost.info
        # Ray's words for a lost actor vary with the moment the node went: its death seen by the GCS,
        # the node's removal, or the actor's connection cut first.
        lost_words = r"died|node was terminated|is unavailable"
        assert re.search(lost_words, lost.data.tags["seqae.error"]), lost.data.tags["seqae.error"]
    finally:
        restore_worker(cluster, node_ip)


@in_turn("killed-worker", FAULT_TESTS)
def test_killed_worker_trials_continue_on_the_survivor_through_an_object_store(cluster):
    """Scenario 3, with retries, and checkpoints and data in S3, which no node shares a disk with:
    the driver tokenizes the data once and publishes it; each node that runs a trial fetches it
    once into its own cache; the trial whose node dies continues from its S3 checkpoint on the other."""
    from seqae_core.checkpoint import CheckpointStore

    name, storage = "survive", f"s3://seqae/{cluster['root'].name}"
    # 7 pages: data no other test's sweep prepared, so the nodes' caches start without it
    submit(cluster, name, "data.max_pages=7", "train.epochs=6", "trials.total=2", env={"SEQAE_STORAGE": storage})

    def epochs() -> dict[int, int]:
        found = {n: CheckpointStore.of_trial(f"{storage}/{name}", n).progress() for n in range(2)}
        return {n: p.epoch for n, p in found.items() if p is not None}

    number, node_ip = kill_worker_mid_trial(cluster, name, epochs, 6)  # the worker node dies with the trial on it
    try:
        info = wait_job(cluster, name)
    finally:
        restore_worker(cluster, node_ip)
    logs = seqae("sweep", "logs", name, "--workspace", cluster["env"]["SEQAE_WORKSPACE"], env=cluster["env"]).stdout
    assert info["job"]["status"] == "SUCCEEDED", logs[-4000:]
    assert info["trials_by_state"] == {"COMPLETE": 2}
    resumed = re.search(rf"trial {number}: continuing after epoch (\d+)", logs)
    assert resumed and int(resumed.group(1)) >= 2, logs[-4000:]  # from its checkpoint, not from epoch 1
    assert epochs() == {0: 6, 1: 6}
    runs = mlflow_runs(None, name, tracking_uri=cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"])
    moved = next(r for r in runs if r.data.tags.get("seqae.trial") == str(number))
    assert moved.info.status == "FINISHED" and moved.data.tags["ray.node_ip"] != node_ip  # finished elsewhere

    # The data: tokenized once, by the driver (its workspace cache); fetched at most once per node.
    cache = Path(cluster["env"]["SEQAE_WORKSPACE"]) / "cache"
    built = [json.loads(m.read_text()) for m in cache.glob("*/manifest.json")]
    entry = next(m for m in built if m["key"]["max_pages"] == 7)
    assert f"published to {storage}/{name}/data" in logs
    fetched = {
        ip: [
            json.loads(f.read_text())
            for f in (cluster["root"] / "nodes" / ip / "cache").glob("*/fetched.json")
            if json.loads((f.parent / "manifest.json").read_text())["key"] == entry["key"]
        ]
        for ip in ("127.0.0.3", "127.0.0.4")
    }
    assert all(len(records) == 1 for records in fetched.values()), fetched  # both nodes ran it; one fetch each
    for ip, (record,) in fetched.items():
        assert record["from"].startswith(f"{storage}/{name}/data/") and record["bytes"] > 0
        manifest = json.loads(
            (cluster["root"] / "nodes" / ip / "cache" / record["from"].rsplit("/", 1)[1] / "manifest.json").read_text()
        )
        assert manifest["built_by"] == entry["built_by"]  # the driver's tokenization, not the node's


@in_turn("torn-down", FAULT_TESTS)
def test_whole_cluster_torn_down_mid_sweep_then_resumed_on_a_fresh_one(cluster):
    """Scenario 5: head included. Ray forgets the job; `seqae sweep resume` resubmits it and the new
    driver carries on from the study, the checkpoints and the runs in the shared storage."""
    from cluster import local

    name = "phoenix"
    submit(cluster, name, "train.epochs=4", "trials.total=4")
    storage = Path(cluster["env"]["SEQAE_STORAGE"]) / name
    driver = job_driver(name)
    # held (sweep_helpers.held) with a trial under way and two epochs from its end, so that it stays
    # unfinished; then killed, as `down` would, which cannot end a stopped process gracefully
    wait_for(
        lambda: held(
            driver,
            lambda: (
                finished(storage) and any(not m["finished"] and m["epoch"] <= 2 for m in trial_metas(storage).values())
            ),
        ),
        400,
        "one trial finished and another under way",
        every=0.1,
    )
    driver.kill()
    down = seqae("cluster", "down", "--dir", str(cluster["root"]), timeout=120)
    assert down.returncode == 0 and "Ray" in down.stdout, down.stderr
    up = seqae("cluster", "up", *cluster["up"], timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    cluster["state"] = local.read_state(cluster["root"])
    assert local.environment(cluster["state"]) == cluster["env"]  # the same addresses, database and storage
    assert (
        local.mlflow_credentials(cluster["state"])["MLFLOW_TRACKING_PASSWORD"] == os.environ["MLFLOW_TRACKING_PASSWORD"]
    )

    resumed = seqae("sweep", "resume", name, "--workspace", cluster["env"]["SEQAE_WORKSPACE"], env=cluster["env"])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    info = wait_job(cluster, name)
    assert info["job"]["status"] == "SUCCEEDED"
    assert info["trials_by_state"] == {"COMPLETE": 4} and len(info["job"]["jobs"]) == 2
    runs = mlflow_runs(None, name, tracking_uri=cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"])
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(int(r.data.tags["seqae.trial"]) for r in runs if "seqae.trial" in r.data.tags) == [0, 1, 2, 3]


# 22 and 23: PostgreSQL, which holds the Optuna study and MLflow's runs, restarted under a sweep ---------
class Driver:
    """A sweep's driver run from this machine on the cluster, as a user's terminal would (not a job:
    the test holds the process), its output in ``log``."""

    def __init__(self, cluster, name: str, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        state = cluster["state"]
        self.env = {
            **cluster["env"],
            "RAY_ADDRESS": f"127.0.0.2:{state.gcs_port}",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": state.token_file,
            **(env or {}),
        }
        self.log = log
        self.process = start(*args, "--workspace", cluster["env"]["SEQAE_WORKSPACE"], log=log, env=self.env)

    def said(self, pattern: str) -> bool:
        return re.search(pattern, self.log.read_text(), re.M) is not None

    def wait(self, timeout: float = 900) -> int:
        return self.process.wait(timeout=timeout)


def postgres_of(cluster):

    return cluster["state"].postgres


def start_postgres(cluster) -> None:
    from cluster import postgres

    pg = postgres_of(cluster)
    if not postgres.running(pg):
        postgres.start(pg, Path(cluster["state"].root) / "logs" / "postgres.log")


def assert_each_trial_once(cluster, name: str, n: int, epochs: int) -> None:
    """n trials, each once in Optuna (no second record of a creation) and once in MLflow, every epoch once in both."""
    from sweeps.stores.study_storage import duplicates

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PGPASSFILE", cluster["env"]["PGPASSFILE"])
        trials = optuna_trials(None, name, cluster["env"]["SEQAE_OPTUNA_STORAGE"])
    assert [(t.number, t.state.name) for t in trials] == [(k, "COMPLETE") for k in range(n)]
    assert duplicates(trials) == set()
    assert all(sorted(t.intermediate_values) == list(range(1, epochs + 1)) for t in trials), [
        sorted(t.intermediate_values) for t in trials
    ]
    uri = cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"]
    runs = mlflow_runs(None, name, tracking_uri=uri)
    assert {r.info.status for r in runs} == {"FINISHED"}, [(r.info.run_name, r.info.status) for r in runs]
    kids = [r for r in runs if "seqae.trial" in r.data.tags]
    assert sorted(int(r.data.tags["seqae.trial"]) for r in kids) == list(range(n))  # one run per trial
    for kid in kids:
        assert metric_steps(kid.info.run_id, "val_token_accuracy", None, tracking_uri=uri) == list(range(1, epochs + 1))
    assert finished(Path(cluster["env"]["SEQAE_STORAGE"]) / name) == set(range(n))  # no trial lost


@in_turn("postgresql-restart", FAULT_TESTS)
def test_a_postgresql_restart_mid_sweep_is_ridden_out_by_the_same_driver(cluster, tmp_path):
    """Scenario 22: PostgreSQL stopped after the sweep's first result, while trials train, and started
    again once the driver has met the outage: the study's storage retries its calls and the MLflow
    writer keeps its writes, so the same driver process finishes every trial, each once everywhere."""
    from cluster import postgres

    name, epochs, n = "pgrestart", 6, 4
    args = [
        "sweep",
        "run",
        str(STUDIES / "quickstart.yaml"),
        "--name",
        name,
        *sets(*SWEEP, "data.max_pages=20", f"train.epochs={epochs}", f"train.patience={epochs}", f"trials.total={n}"),
    ]
    driver = Driver(cluster, name, tmp_path / "driver.log", *args)
    try:
        wait_for(
            lambda: driver.said(r"^trial \d+  epoch 1/") or driver.process.poll() is not None,
            600,
            "the sweep's first result",
        )
        postgres.stop(postgres_of(cluster))
        try:
            wait_for(
                lambda: (
                    driver.said(r"the Optuna storage \S+ did not answer while") or driver.process.poll() is not None
                ),
                300,
                "the driver to meet the outage",
            )
        finally:
            start_postgres(cluster)
        assert driver.wait() == 0, driver.log.read_text()[-4000:]
    finally:
        kill_group(driver.process)
        start_postgres(cluster)
    text = driver.log.read_text()
    assert "the Optuna storage answers again after" in text and "did not answer for" not in text, text[-4000:]
    sessions = json.loads((Path(cluster["env"]["SEQAE_WORKSPACE"]) / "sweeps" / name / "sweep.json").read_text())[
        "sessions"
    ]
    assert len(sessions) == 1 and sessions[0]["outcome"] == "complete" and sessions[0]["pid"] == driver.process.pid
    assert sessions[0]["optuna_outage_seconds"] > 0
    assert_each_trial_once(cluster, name, n, epochs)


@in_turn("database-away", FAULT_TESTS)
def test_a_database_away_past_the_limit_stops_the_driver_in_one_line_and_resume_finishes(cluster, tmp_path, receiver):
    """Scenario 23: PostgreSQL away longer than SEQAE_STORAGE_RETRY_SECONDS: the driver stops with exit
    code 75 and one line naming the storage and `seqae sweep resume NAME`, and says so to the sweep's
    receiver; once the database is back, the resume finishes the sweep with nothing lost or doubled."""
    from cluster import postgres

    name, epochs, n = "pgaway", 4, 4
    args = [
        "sweep",
        "run",
        str(STUDIES / "quickstart.yaml"),
        "--name",
        name,
        *sets(
            *SWEEP,
            "data.max_pages=20",
            f"train.epochs={epochs}",
            f"train.patience={epochs}",
            f"trials.total={n}",
            receiver.notify(),
        ),
    ]
    driver = Driver(cluster, name, tmp_path / "driver.log", *args, env={"SEQAE_STORAGE_RETRY_SECONDS": "5"})
    try:
        wait_for(
            lambda: driver.said(r"^trial \d+  epoch 1/") or driver.process.poll() is not None,
            600,
            "the sweep's first result",
        )
        postgres.stop(postgres_of(cluster))
        try:
            assert driver.wait(timeout=300) == 75, driver.log.read_text()[-4000:]
        finally:
            start_postgres(cluster)
    finally:
        kill_group(driver.process)
        start_postgres(cluster)
    text = driver.log.read_text()
    storage = cluster["env"]["SEQAE_OPTUNA_STORAGE"]
    # exit code 75 is the command's own (an uncaught error exits 1); Ray's log may show the error it met
    errors = [line for line in text.splitlines() if line.startswith("seqae: error: ")]
    assert len(errors) == 1, text[-4000:]
    assert errors[0].startswith(f"seqae: error: the Optuna storage {storage} did not answer for ")
    assert errors[0].endswith(f"once it answers, continue the sweep with `seqae sweep resume {name}`")
    sessions = json.loads((Path(cluster["env"]["SEQAE_WORKSPACE"]) / "sweeps" / name / "sweep.json").read_text())[
        "sessions"
    ]
    assert sessions[-1]["outcome"] == "storage unreachable"
    end = receiver.received[-1]
    assert end["title"] == f"seqae {name}: the sweep stopped: its Optuna storage does not answer", receiver.titles()
    assert "did not answer for" in end["message"], end

    resumed = Driver(cluster, name, tmp_path / "resume.log", "sweep", "resume", name)
    try:
        assert resumed.wait() == 0, resumed.log.read_text()[-4000:]
    finally:
        kill_group(resumed.process)
    assert_each_trial_once(cluster, name, n, epochs)


def _trial_node_ip(cluster, name: str, number: int) -> str:
    def tagged():
        runs = mlflow_runs(None, name, tracking_uri=cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"])
        return next(
            (r.data.tags.get("ray.node_ip") for r in runs if r.data.tags.get("seqae.trial") == str(number)), None
        )

    wait_for(lambda: tagged() is not None, 60, f"the node of trial {number}")
    return tagged()
