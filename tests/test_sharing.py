"""One cluster, two users' sweeps (issue 81): a local cluster of two workers with two CPUs each
(four trial slots). User A submits eight trials at four at a time; twenty seconds later user B
submits four more from a workspace of their own. With B at a higher priority, B's trials take
A's slots at A's trials' next validation, and A's preempted trials resume from their checkpoints
with the numbers of uninterrupted runs; at equal priorities each holds two slots. A user with a
quota below their sweep's ceiling holds no more than it, waits, and runs once an admin raises it;
the queue's rows and the quota outlive `seqae cluster down` + `up`, and the resumed sweep keeps to
its share again.

Slots held are read from Ray itself (the alive trial actors of each sweep's job, through the
dashboard's state API), every second; the timelines are written to ``timeline-*.json`` beside the
test's files."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from seqae_core.checkpoint import CheckpointStore
from sweeps.stores.workspace import Workspace
from tests.conftest import REPO, WIKI_MINI
from tests.rotation import in_turn
from tests.sweep_helpers import STUDIES, local_cluster, metric_steps, mlflow_runs, optuna_trials, seqae, sets, wait_for

pytestmark = pytest.mark.slow

# Each scenario takes minutes on the local cluster: a commit runs one of them (tests/rotation.py),
# SEQAE_ROTATION=all both.
SCENARIOS = ["priority", "equal-shares", "quota"]

# fp32 without dropout and every trial to its last epoch: a trial's numbers are its own, however
# often it was paused; the same seed proposes the same trials in both sweeps
TINY = [
    f"data.path={WIKI_MINI}",
    "data.max_pages=12",
    "data.input_len=16",
    "model.latent_len=8",
    "train.epochs=3",
    "train.precision=fp32",
    "model.dropout=0.0",
    "scheduler.type=none",
    "resources.cpu=1",
    "retries=1",
    "max_concurrent=4",
]
A, B = [*TINY, "trials.total=8"], [*TINY, "trials.total=4"]
GAP = 20  # seconds between A's submit and B's


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharing")
    yield from local_cluster(root, workers=2, cpus_per_worker=2)


def _get(cluster, path: str) -> Any:
    token = Path(cluster["state"].token_file).read_text().strip()
    request = urllib.request.Request(
        f"{cluster['env']['SEQAE_RAY_ADDRESS']}{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def held(cluster) -> dict[str, int]:
    """Slots held now, by sweep: the placement groups Ray has created for each sweep's job (Tune
    reserves one per trial it places, before the trial's process starts, and removes it when the
    trial ends or is paused)."""
    jobs = {
        j["job_id"]: j["submission_id"].split("-")[1]
        for j in _get(cluster, "/api/jobs/")
        if j.get("job_id") and (j.get("submission_id") or "").startswith("seqae-")
    }
    groups = _get(
        cluster,
        "/api/v0/placement_groups?filter_keys=state&filter_predicates=%3D&filter_values=CREATED&limit=1000&detail=1",
    )
    counts = {name: 0 for name in jobs.values()}
    for group in groups["data"]["result"]["result"]:
        FIELDS.update(group)
        if group.get("creator_job_id") in jobs:
            counts[jobs[group["creator_job_id"]]] += 1
    return counts


FIELDS: set[str] = set()  # the placement groups' fields, for the timeline's file


def demands(cluster) -> dict[str, int]:
    """The trials each sweep could run now, as its driver last told the cluster's queue."""
    from sweeps.stores.queue import Queue

    return {e.sweep: e.demand for e in Queue(cluster["env"]["SEQAE_OPTUNA_STORAGE"], create=False).entries()}


def jobs_ended(cluster, names: set[str]) -> bool:
    ended = {
        j["submission_id"].split("-")[1]
        for j in _get(cluster, "/api/jobs/")
        if (j.get("submission_id") or "").startswith("seqae-") and j["status"] in ("SUCCEEDED", "FAILED", "STOPPED")
    }
    return names <= ended


def submit(
    cluster,
    name: str,
    overrides: list[str],
    workspace: Path,
    *extra: str,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
) -> float:
    run = seqae(
        "sweep",
        "submit",
        str(cwd / STUDIES.relative_to(REPO) / "quickstart.yaml"),
        "--name",
        name,
        "--workspace",
        str(workspace),
        *sets(*overrides),
        *extra,
        env=env or cluster["env"],
        cwd=cwd,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return time.time()


def two_users(
    cluster, tmp: Path, a: str, b: str, *b_extra: str, cwd: Path = REPO, during: Any = None, queue: bool = True
) -> dict[str, Any]:
    """A submits, B GAP seconds later (with ``b_extra``); slots held sampled every second until
    both jobs end, with each sweep's demand from the cluster's queue (``queue``: the code under
    test has one). ``during(samples)`` runs once, while B waits or runs beside A."""
    start = submit(cluster, a, A, tmp / "ws-a", cwd=cwd)
    samples: list[dict[str, Any]] = []
    b_submitted = None
    while not (b_submitted and jobs_ended(cluster, {a, b})):
        now = time.time()
        if b_submitted is None and now - start >= GAP:
            b_submitted = submit(cluster, b, B, tmp / "ws-b", *b_extra, cwd=cwd)
        counts = held(cluster)
        wants = demands(cluster) if queue else {}
        samples.append(
            {
                "t": round(time.time() - start, 1),
                a: counts.get(a, 0),
                b: counts.get(b, 0),
                "demand": [wants.get(a), wants.get(b)],
            }
        )
        if during is not None and b_submitted and samples[-1][b] > 0 and samples[-1][a] > 0:
            during(samples)
            during = None
        assert time.time() - start < 900, samples
        time.sleep(max(0.0, 1.0 - (time.time() - now)))
    assert b_submitted is not None
    b_first = next(s["t"] for s in samples if s[b] > 0) - (b_submitted - start)
    b_end = max(s["t"] for s in samples if s[b] > 0) - (b_submitted - start)
    return {
        "samples": samples,
        "b_submitted": round(b_submitted - start, 1),
        "b_submitted_at": b_submitted,
        "b_first_train_s": round(b_first, 1),
        "b_last_held_s": round(b_end, 1),
        "placement_group_fields": sorted(FIELDS),
    }


def every_5s(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out, next_t = [], 0.0
    for s in samples:
        if s["t"] >= next_t:
            out.append(s)
            next_t += 5.0
    return out


def validations(cluster, name: str) -> dict[int, list[tuple[float, ...]]]:
    """Each trial's per-validation values (validation loss and token accuracy), from its records."""
    storage = f"{cluster['state'].storage}/{name}"
    out = {}
    for number in CheckpointStore.trials(storage):
        progress = CheckpointStore.of_trial(storage, number).progress()
        assert progress is not None, (name, number)
        out[number] = [(r["epoch"], r["val_loss"], r["val_token_accuracy"]) for r in progress.history]
    return out


@pytest.fixture(autouse=True)
def studies_readable(cluster, monkeypatch):
    monkeypatch.setenv("PGPASSFILE", cluster["env"]["PGPASSFILE"])  # the studies and the queue, read here


@in_turn("priority", SCENARIOS, salt=1, what="the sharing scenario")
def test_a_higher_priority_sweep_takes_slots_at_the_next_validation_and_the_preempted_trials_lose_nothing(
    cluster, tmp_path
):
    # B alone on the empty cluster: its time, and the uninterrupted twins of A's first four trials
    alone_submitted = submit(cluster, "balone", B, tmp_path / "ws-b")
    wait_for(lambda: jobs_ended(cluster, {"balone"}), 600, "B alone", every=2)
    record = Workspace(cluster["env"]["SEQAE_WORKSPACE"]).read("balone")
    b_alone = record.sessions[-1].ended - alone_submitted

    shown: dict[str, str] = {}

    def during(samples: list[dict[str, Any]]) -> None:
        for key, argv in (("queue", ["cluster", "queue"]), ("status", ["sweep", "status", "usera"])):
            run = seqae(
                *argv, "--workspace", str(tmp_path / ("ws-a" if key == "status" else "ws-b")), env=cluster["env"]
            )
            shown[key] = run.stdout + run.stderr

    timeline = two_users(cluster, tmp_path, "usera", "userb", "--priority", "5", during=during)
    b_total = Workspace(cluster["env"]["SEQAE_WORKSPACE"]).read("userb").sessions[-1].ended - timeline["b_submitted_at"]
    times = {"b_alone_s": round(b_alone, 1), "b_behind_a_s": round(b_total, 1)}
    (tmp_path.parent / "timeline-priority.json").write_text(
        json.dumps({**timeline, **times, "shown": shown, "every_5s": every_5s(timeline["samples"])}, indent=1)
    )
    samples = timeline["samples"]
    first_b = next(i for i, s in enumerate(samples) if s["userb"] > 0)
    # B did not wait for A: A still trains after B's first trial started, and gave B every slot meanwhile
    assert any(s["usera"] > 0 for s in samples[first_b:]), samples
    assert any(s["userb"] == 4 and s["usera"] == 0 for s in samples), samples
    # A's trials preempted: paused at a validation and resumed, with the values of B's twins
    a_values, twins = validations(cluster, "usera"), validations(cluster, "balone")
    assert sorted(a_values) == list(range(8))
    for number, values in twins.items():
        assert a_values[number] == values, (number, a_values[number], values)
    for name in ("usera", "userb"):
        states = {t.state.name for t in optuna_trials(Path(), name, cluster["env"]["SEQAE_OPTUNA_STORAGE"])}
        assert states == {"COMPLETE"}, (name, states)
        for number, values in validations(cluster, name).items():
            assert [v[0] for v in values] == [1, 2, 3], (name, number, values)  # each epoch once
    uri = cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"]
    children = [r for r in mlflow_runs(None, "usera", tracking_uri=uri) if "seqae.trial" in r.data.tags]
    assert len(children) == 8 and all(r.info.status == "FINISHED" for r in children)
    for run in children:  # each epoch once, the paused trials' too
        assert metric_steps(run.info.run_id, "val_token_accuracy", None, uri) == [1, 2, 3], run.data.tags
    assert "usera" in shown["queue"] and "userb" in shown["queue"], shown
    logs = seqae("sweep", "logs", "usera", "--workspace", str(tmp_path / "ws-a"), env=cluster["env"]).stdout
    assert "gives its slot up" in logs, logs
    print(json.dumps({**times, **{k: v for k, v in timeline.items() if k != "samples"}}))


@in_turn("equal-shares", SCENARIOS, salt=1, what="the sharing scenario")
def test_equal_priorities_hold_equal_shares(cluster, tmp_path):
    timeline = two_users(cluster, tmp_path, "fairab", "fairbb")
    (tmp_path.parent / "timeline-fair.json").write_text(
        json.dumps({**timeline, "every_5s": every_5s(timeline["samples"])}, indent=1)
    )
    # while both have trials to run (each could run two or more), from B's first placed trial on
    samples = every_5s(timeline["samples"])
    first_b = next(i for i, s in enumerate(samples) if s["fairbb"] > 0)
    window = [s for s in samples[first_b:] if all(d is not None and d >= 2 for d in s["demand"])]
    off = [s for s in window if (s["fairab"], s["fairbb"]) != (2, 2)]
    assert window and len(off) <= len(window) / 4, timeline["samples"]
    assert all(abs(s["fairab"] - 2) <= 1 and abs(s["fairbb"] - 2) <= 1 for s in window), window


def user_env(cluster, name: str) -> dict[str, str]:
    """What user ``name`` exports to submit, from the folder `seqae cluster add-user` gave them."""
    added = seqae("cluster", "add-user", name, "--dir", str(cluster["root"]), env=cluster["env"])
    assert added.returncode == 0, added.stdout + added.stderr
    folder = Path(cluster["root"]) / "users" / name
    return {
        **cluster["env"],
        "MLFLOW_TRACKING_USERNAME": name,
        "MLFLOW_TRACKING_PASSWORD": (folder / "mlflow_password").read_text().strip(),
        "PGPASSFILE": str(folder / "pgpass"),
        "RAY_AUTH_TOKEN_PATH": str(folder / "ray_token"),
    }


def quota(cluster, user: str, cpus: int) -> None:
    """The admin's `seqae cluster quota`."""
    run = seqae("cluster", "quota", user, "--cpus", str(cpus), env=cluster["env"])
    assert run.returncode == 0, run.stdout + run.stderr


def sample_until(cluster, name: str, done: Any, most: int, timeout: float = 600) -> list[int]:
    """Slots sweep ``name`` holds, every second until ``done(samples)``; never more than ``most``."""
    samples: list[int] = []
    deadline = time.time() + timeout
    while not done(samples):
        samples.append(held(cluster).get(name, 0))
        assert samples[-1] <= most, samples
        assert time.time() < deadline, samples
        time.sleep(1.0)
    return samples


@in_turn("quota", SCENARIOS, salt=1, what="the sharing scenario")
def test_a_user_over_quota_waits_then_runs_and_the_queue_outlives_the_clusters_restart(cluster, tmp_path):
    from cluster import local
    from sweeps.stores.queue import Queue
    from sweeps.stores.shares import QUOTA, Quota
    from tests.sweep_helpers import held as holding
    from tests.sweep_helpers import job_driver, trial_metas

    name, total, epochs = "carolq", 7, 4
    carol, workspace = user_env(cluster, "carol"), tmp_path / "ws-carol"
    shown: dict[str, str] = {}

    def queue() -> Queue:  # read anew each time: a reader finds the tables only once a driver created them
        return Queue(cluster["env"]["SEQAE_OPTUNA_STORAGE"], create=False)

    def show(key: str) -> dict[str, Any]:
        """`seqae sweep status` as JSON, then `seqae cluster queue` and `seqae sweep status` as carol sees them."""
        run = seqae("sweep", "status", name, "--json", "--workspace", str(workspace), env=carol)
        assert run.returncode == 0, run.stderr
        for argv in (["cluster", "queue"], ["sweep", "status", name]):
            shown_run = seqae(*argv, "--workspace", str(workspace), env=carol)
            assert shown_run.returncode == 0, shown_run.stdout + shown_run.stderr
            shown[f"{key}: seqae {' '.join(argv)}"] = shown_run.stdout
        return json.loads(run.stdout)

    # carol's quota (1 CPU) is below her sweep's ceiling (3 trials of 1 CPU): she holds 1 slot of 4
    quota(cluster, "carol", 1)
    submit(
        cluster,
        name,
        [*TINY, f"train.epochs={epochs}", f"trials.total={total}", "max_concurrent=3"],
        workspace,
        "--priority",
        "2",
        env=carol,
    )
    sample_until(cluster, name, lambda s: s.count(1) >= 5, most=1)
    status = show("quota 1")
    assert status["owner"] == "carol" and status["queue"]["why"] == QUOTA, status
    assert status["queue"]["share"] == 1 and status["trials_by_state"].get("RUNNING", 0) <= 1, status

    # the admin raises it to 2: she runs two at once, never three
    quota(cluster, "carol", 2)
    sample_until(cluster, name, lambda s: 2 in s, most=2)
    storage = Path(cluster["env"]["SEQAE_STORAGE"]) / name
    driver = job_driver(name)
    # held (SIGSTOP) with two trials under way, each an epoch or more from its end; then killed, as
    # `down` would, which cannot end a stopped process gracefully
    wait_for(
        lambda: holding(
            driver, lambda: sum(not m["finished"] and m["epoch"] < epochs for m in trial_metas(storage).values()) >= 2
        ),
        300,
        "two trials under way",
        every=0.1,
    )
    driver.kill()
    before = queue().entry(name)
    down = seqae("cluster", "down", "--dir", str(cluster["root"]), timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    up = seqae("cluster", "up", *cluster["up"], timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    cluster["state"] = local.read_state(cluster["root"])
    assert local.environment(cluster["state"]) == cluster["env"]

    # the queue's row (its owner, priority, arrival) and carol's quota are still in the database
    after = queue().entry(name)
    assert after is not None and (after.user, after.priority, after.arrived) == ("carol", 2, before.arrived), after
    assert queue().quotas()["carol"] == Quota(cpus=2.0)
    listed = seqae("cluster", "queue", "--workspace", str(workspace), env=carol).stdout
    assert re.search(rf"{name}\s+carol\s+2\s+1\s+stopped\s+0/0/2 CPUs", listed), listed

    # the admin lowers it to 1 before carol resumes: of her two trials under way, one trains, the
    # other waits for a slot; raised to 2 again, she gets her share back
    quota(cluster, "carol", 1)
    resumed = seqae("sweep", "resume", name, "--workspace", str(workspace), env=carol)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    sample_until(cluster, name, lambda s: 1 in s, most=1)
    # the new driver held (SIGSTOP) once its beat says one trial trains while Optuna holds both
    driver = job_driver(name)
    wait_for(
        lambda: holding(
            driver,
            lambda: (
                (e := queue().entry(name)) is not None
                and e.training == 1
                and sum(
                    t.state.name == "RUNNING"
                    for t in optuna_trials(Path(), name, cluster["env"]["SEQAE_OPTUNA_STORAGE"])
                )
                == 2
            ),
        ),
        300,
        "one trial training and one waiting",
        every=0.5,
    )
    try:
        waiting = show("resumed, quota 1")
    finally:
        driver.resume()
    by_state = waiting["trials_by_state"]
    assert (by_state.get("RUNNING"), by_state.get("WAITING_FOR_SLOT"), by_state.get("PREEMPTED")) == (1, 1, None), (
        by_state
    )
    assert waiting["queue"]["why"] == QUOTA and waiting["queue"]["priority"] == 2, waiting["queue"]
    assert "(quota)" in shown["resumed, quota 1: seqae cluster queue"], shown
    quota(cluster, "carol", 2)
    samples = sample_until(cluster, name, lambda s: jobs_ended(cluster, {name}), most=2)
    assert 2 in samples, samples
    (tmp_path.parent / "quota-shown.json").write_text(json.dumps(shown, indent=1))
    print("\n\n".join(f"$ {key}\n{text}" for key, text in shown.items()))

    # every trial once, each epoch once in Optuna and in MLflow
    trials = optuna_trials(Path(), name, cluster["env"]["SEQAE_OPTUNA_STORAGE"])
    assert [(t.number, t.state.name) for t in trials] == [(k, "COMPLETE") for k in range(total)]
    assert all(sorted(t.intermediate_values) == list(range(1, epochs + 1)) for t in trials)
    for number, values in validations(cluster, name).items():
        assert [v[0] for v in values] == list(range(1, epochs + 1)), (number, values)
    uri = cluster["env"]["SEQAE_MLFLOW_TRACKING_URI"]
    children = [r for r in mlflow_runs(None, name, tracking_uri=uri) if "seqae.trial" in r.data.tags]
    assert sorted(int(r.data.tags["seqae.trial"]) for r in children) == list(range(total))
    for run in children:
        assert run.info.status == "FINISHED", run.data.tags
        assert metric_steps(run.info.run_id, "val_token_accuracy", None, uri) == list(range(1, epochs + 1))
    assert queue().entry(name).ended == "complete"
