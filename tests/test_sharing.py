"""One cluster, two users' sweeps (issue 81): a local cluster of two workers with two CPUs each
(four trial slots). User A submits eight trials at four at a time; twenty seconds later user B
submits four more from a workspace of their own. With B at a higher priority, B's trials take
A's slots at A's trials' next validation, and A's preempted trials resume from their checkpoints
with the numbers of uninterrupted runs; at equal priorities each holds two slots.

Slots held are read from Ray itself (the alive trial actors of each sweep's job, through the
dashboard's state API), every second; the timelines are written to ``timeline-*.json`` beside the
test's files."""

from __future__ import annotations

import json
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
SCENARIOS = ["priority", "equal-shares"]

# fp32 without dropout and every trial to its last epoch: a trial's numbers are its own, however
# often it was paused; the same seed proposes the same trials in both sweeps
TINY = [f"data.path={WIKI_MINI}", "data.max_pages=12", "data.input_len=16", "model.latent_len=8", "train.epochs=3",
        "train.precision=fp32", "model.dropout=0.0", "scheduler.type=none", "resources.cpu=1", "retries=1",
        "max_concurrent=4"]
A, B = [*TINY, "trials.total=8"], [*TINY, "trials.total=4"]
GAP = 20  # seconds between A's submit and B's


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharing")
    yield from local_cluster(root, workers=2, cpus_per_worker=2)


def _get(cluster, path: str) -> Any:
    token = Path(cluster["state"]["token_file"]).read_text().strip()
    request = urllib.request.Request(f"{cluster['env']['SEQAE_RAY_ADDRESS']}{path}",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def held(cluster) -> dict[str, int]:
    """Slots held now, by sweep: the placement groups Ray has created for each sweep's job (Tune
    reserves one per trial it places, before the trial's process starts, and removes it when the
    trial ends or is paused)."""
    jobs = {j["job_id"]: j["submission_id"].split("-")[1] for j in _get(cluster, "/api/jobs/")
            if j.get("job_id") and (j.get("submission_id") or "").startswith("seqae-")}
    groups = _get(cluster, "/api/v0/placement_groups?filter_keys=state&filter_predicates=%3D&filter_values=CREATED"
                           "&limit=1000&detail=1")
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
    ended = {j["submission_id"].split("-")[1] for j in _get(cluster, "/api/jobs/")
             if (j.get("submission_id") or "").startswith("seqae-") and j["status"] in ("SUCCEEDED", "FAILED", "STOPPED")}
    return names <= ended


def submit(cluster, name: str, overrides: list[str], workspace: Path, *extra: str, cwd: Path = REPO) -> float:
    run = seqae("sweep", "submit", str(cwd / STUDIES.relative_to(REPO) / "quickstart.yaml"), "--name", name, "--workspace", str(workspace),
                *sets(*overrides), *extra, env=cluster["env"], cwd=cwd)
    assert run.returncode == 0, run.stdout + run.stderr
    return time.time()


def two_users(cluster, tmp: Path, a: str, b: str, *b_extra: str, cwd: Path = REPO,
              during: Any = None, queue: bool = True) -> dict[str, Any]:
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
        samples.append({"t": round(time.time() - start, 1), a: counts.get(a, 0), b: counts.get(b, 0),
                        "demand": [wants.get(a), wants.get(b)]})
        if during is not None and b_submitted and samples[-1][b] > 0 and samples[-1][a] > 0:
            during(samples)
            during = None
        assert time.time() - start < 900, samples
        time.sleep(max(0.0, 1.0 - (time.time() - now)))
    assert b_submitted is not None
    b_first = next(s["t"] for s in samples if s[b] > 0) - (b_submitted - start)
    b_end = max(s["t"] for s in samples if s[b] > 0) - (b_submitted - start)
    return {"samples": samples, "b_submitted": round(b_submitted - start, 1), "b_submitted_at": b_submitted,
            "b_first_train_s": round(b_first, 1), "b_last_held_s": round(b_end, 1), "placement_group_fields": sorted(FIELDS)}


def every_5s(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out, next_t = [], 0.0
    for s in samples:
        if s["t"] >= next_t:
            out.append(s)
            next_t += 5.0
    return out


def validations(cluster, name: str) -> dict[int, list[tuple[float, ...]]]:
    """Each trial's per-validation values (validation loss and token accuracy), from its records."""
    storage = f"{cluster['state']['storage']}/{name}"
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
        cluster, tmp_path):
    # B alone on the empty cluster: its time, and the uninterrupted twins of A's first four trials
    alone_submitted = submit(cluster, "balone", B, tmp_path / "ws-b")
    wait_for(lambda: jobs_ended(cluster, {"balone"}), 600, "B alone", every=2)
    record = Workspace(cluster["env"]["SEQAE_WORKSPACE"]).read("balone")
    b_alone = record.sessions[-1]["ended"] - alone_submitted

    shown: dict[str, str] = {}

    def during(samples: list[dict[str, Any]]) -> None:
        for key, argv in (("queue", ["cluster", "queue"]), ("status", ["sweep", "status", "usera"])):
            run = seqae(*argv, "--workspace", str(tmp_path / ("ws-a" if key == "status" else "ws-b")),
                        env=cluster["env"])
            shown[key] = run.stdout + run.stderr

    timeline = two_users(cluster, tmp_path, "usera", "userb", "--priority", "5", during=during)
    b_total = Workspace(cluster["env"]["SEQAE_WORKSPACE"]).read("userb").sessions[-1]["ended"] - timeline["b_submitted_at"]
    times = {"b_alone_s": round(b_alone, 1), "b_behind_a_s": round(b_total, 1)}
    (tmp_path.parent / "timeline-priority.json").write_text(json.dumps(
        {**timeline, **times, "shown": shown, "every_5s": every_5s(timeline["samples"])}, indent=1))
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
    (tmp_path.parent / "timeline-fair.json").write_text(json.dumps({**timeline, "every_5s": every_5s(
        timeline["samples"])}, indent=1))
    # while both have trials to run (each could run two or more), from B's first placed trial on
    samples = every_5s(timeline["samples"])
    first_b = next(i for i, s in enumerate(samples) if s["fairbb"] > 0)
    window = [s for s in samples[first_b:] if all(d is not None and d >= 2 for d in s["demand"])]
    off = [s for s in window if (s["fairab"], s["fairbb"]) != (2, 2)]
    assert window and len(off) <= len(window) / 4, timeline["samples"]
    assert all(abs(s["fairab"] - 2) <= 1 and abs(s["fairbb"] - 2) <= 1 for s in window), window
