"""The cluster's slot policy (sweeps.stores.shares) and the queue it reads (sweeps.stores.queue), on
SQLite: strict priority, weighted fair share, ceilings, quotas and capacity; who may change a
priority or a quota."""

from __future__ import annotations

import time

import pytest

from seqae_errors import ConfigError
from sweeps.stores import queue as Q
from sweeps.stores.ownership import ADMIN, USER
from sweeps.stores.shares import CAPACITY, FAIR, PRIORITY, QUOTA, Capacity, Claim, Quota, Share, allocate
from tests.refusal import assert_refused

FOUR = Capacity(4)


def slots(claims, capacity=FOUR, quotas=None):
    return {k: s.slots for k, s in allocate(claims, capacity, quotas).items()}


def claim(sweep, user="ann", priority=0, demand=4, cpus=1.0, gpus=0.0, weight=1.0, arrived=0.0):
    return Claim(sweep, user, priority, demand, cpus, gpus, weight, arrived)


def test_one_sweep_gets_what_it_asks_for_within_capacity():
    assert slots([claim("a", demand=3)]) == {"a": 3}
    assert slots([claim("a", demand=8)]) == {"a": 4}
    assert allocate([claim("a", demand=8)], Capacity(4))["a"].why == CAPACITY


def test_equal_priorities_share_equally_whoever_came_first():
    assert slots([claim("a", arrived=0), claim("b", "bob", arrived=20)]) == {"a": 2, "b": 2}
    assert slots([claim("a"), claim("b", "bob"), claim("c", "cy")], Capacity(6)) == {"a": 2, "b": 2, "c": 2}
    # an odd slot goes to the earlier arrival
    assert slots([claim("b", "bob", arrived=20), claim("a", arrived=0)], Capacity(5)) == {"a": 3, "b": 2}
    assert allocate([claim("a"), claim("b", "bob", arrived=1)], Capacity(4))["b"].why == FAIR


def test_a_sweep_that_asks_for_less_leaves_the_rest_to_the_others():
    assert slots([claim("a", demand=1), claim("b", "bob")]) == {"a": 1, "b": 3}
    assert slots([claim("a", demand=0), claim("b", "bob")]) == {"a": 0, "b": 4}


def test_weights_divide_in_proportion():
    assert slots([claim("a", demand=8, weight=3.0), claim("b", "bob", demand=8, weight=1.0)], Capacity(8)) == {
        "a": 6,
        "b": 2,
    }


def test_a_higher_priority_is_filled_first_and_the_lower_gets_what_is_left():
    shares = allocate([claim("a", arrived=0), claim("b", "bob", priority=5, arrived=20)], Capacity(4))
    assert {k: s.slots for k, s in shares.items()} == {"a": 0, "b": 4}
    assert shares["a"].why == PRIORITY and shares["b"].why is None
    assert slots([claim("a"), claim("b", "bob", priority=5, demand=3)]) == {"a": 1, "b": 3}


def test_a_lower_priority_backfills_what_a_higher_ones_shape_leaves():
    # the urgent sweep's trials take 2 CPUs each: 3 CPUs fit one, the last CPU goes to the 1-CPU sweep
    assert slots([claim("big", priority=1, cpus=2.0), claim("small", "bob")], Capacity(3)) == {"big": 1, "small": 1}


def test_quotas_cap_a_users_sweeps_together_and_leave_the_rest_to_others():
    quotas = {"ann": Quota(cpus=2)}
    shares = allocate([claim("a1"), claim("a2", arrived=1), claim("b", "bob", arrived=2)], Capacity(6), quotas)
    assert {k: s.slots for k, s in shares.items()} == {"a1": 1, "a2": 1, "b": 4}
    assert shares["a1"].why == QUOTA
    # a quota in GPUs: GPU trials of one user, at most 1 GPU at once
    gpu = allocate([claim("g", cpus=1, gpus=1)], Capacity(8, 4), {"ann": Quota(gpus=1)})
    assert gpu["g"].slots == 1 and gpu["g"].why == QUOTA
    # over its quota entirely, a sweep waits (0 slots), it never fails
    assert slots([claim("a", cpus=4)], Capacity(8), {"ann": Quota(cpus=2)}) == {"a": 0}


@pytest.mark.parametrize("seed", range(20))
def test_never_past_capacity_demand_or_quota(seed):
    import random

    rng = random.Random(seed)
    claims = [
        claim(
            f"s{i}",
            f"u{rng.randrange(3)}",
            rng.randrange(3),
            rng.randrange(6),
            rng.choice([0.5, 1, 2]),
            rng.choice([0, 0, 1]),
            rng.choice([1.0, 2.0]),
            rng.random(),
        )
        for i in range(rng.randrange(1, 7))
    ]
    capacity = Capacity(rng.randrange(0, 12), rng.randrange(0, 3))
    quotas = {"u0": Quota(cpus=rng.randrange(1, 5))}
    shares = allocate(claims, capacity, quotas)
    by = {c.sweep: c for c in claims}
    assert sum(s.slots * by[k].cpus for k, s in shares.items()) <= capacity.cpus + 1e-9
    assert sum(s.slots * by[k].gpus for k, s in shares.items()) <= capacity.gpus + 1e-9
    assert all(s.slots <= by[k].demand for k, s in shares.items())
    assert sum(s.slots * by[k].cpus for k, s in shares.items() if by[k].user == "u0") <= quotas["u0"].cpus + 1e-9
    # work-conserving: a sweep short of its demand could not have had one more trial
    for k, s in shares.items():
        c = by[k]
        if s.slots < c.demand and s.why != QUOTA:
            used_cpus = sum(x.slots * by[n].cpus for n, x in shares.items())
            used_gpus = sum(x.slots * by[n].gpus for n, x in shares.items())
            assert (
                used_cpus + c.cpus > capacity.cpus + 1e-9
                or used_gpus + c.gpus > capacity.gpus + 1e-9
                or any(by[n].priority >= c.priority and x.slots for n, x in shares.items() if n != k)
            )


def entry(sweep, user, priority=0, demand=4, arrived=None, heartbeat=None, ended=None, training=0, weight=1.0):
    now = time.time()
    return Q.Entry(
        sweep,
        user,
        priority,
        4,
        demand,
        1.0,
        0.0,
        training,
        0,
        0,
        0,
        8,
        arrived or now,
        heartbeat or now,
        ended,
        4.0,
        0.0,
        weight=weight,
    )


@pytest.fixture
def queue(tmp_path):
    return Q.Queue(f"sqlite:///{tmp_path / 'optuna.db'}")


def test_the_queue_divides_among_live_sweeps_and_shows_each(queue):
    queue.join(entry("a", "ann", arrived=1.0, training=4))
    queue.join(entry("b", "bob", arrived=2.0))
    queue.join(entry("old", "cy", heartbeat=time.time() - 2 * Q.STALE_SECONDS))  # its driver died: no slots
    assert {k: s.slots for k, s in queue.shares().items()} == {"a": 2, "b": 2}
    view = {p.sweep: p for p in queue.view()}
    assert (view["a"].state, view["a"].held, view["a"].share, view["a"].place) == (Q.RUNNING, 4, 2, None)
    assert (view["b"].state, view["b"].share, view["b"].place) == (Q.QUEUED, 2, 1)
    assert view["old"].state == Q.STOPPED
    queue.leave("a", "complete", 8)
    assert {k: s.slots for k, s in queue.shares().items()} == {"b": 4}
    assert [(p.state, p.trials_done) for p in queue.view() if p.sweep == "a"] == [(Q.DONE, 8)]


def test_a_sweep_that_joins_again_keeps_its_priority_and_place(queue, monkeypatch):
    monkeypatch.setenv(USER, "ann")
    queue.join(entry("a", "ann", arrived=1.0))
    queue.set_priority("a", 7)
    again = queue.join(entry("a", "ann", arrived=50.0))
    assert (again.priority, again.arrived) == (7, 1.0)


def test_only_the_owner_or_an_admin_changes_a_priority_and_only_an_admin_a_quota(queue, monkeypatch):
    queue.join(entry("a", "ann"))
    monkeypatch.setenv(USER, "bob")
    with pytest.raises(ConfigError, match="sweep 'a' belongs to ann; bob may not change its priority"):
        queue.set_priority("a", 9)
    with pytest.raises(ConfigError, match="quotas are set by an MLflow admin"):
        queue.set_quota("bob", Quota(cpus=100))
    assert queue.entry("a").priority == 0 and queue.quotas() == {}
    with pytest.raises(ConfigError, match="'nope' is not in the cluster's queue"):
        queue.set_priority("nope", 1)
    monkeypatch.setenv(USER, ADMIN)
    assert queue.set_priority("a", 3).priority == 3
    queue.set_quota("ann", Quota(cpus=1))
    assert queue.quotas() == {"ann": Quota(cpus=1.0)}
    assert {k: s.slots for k, s in queue.shares().items()} == {"a": 1}


# -- the command line: `seqae cluster queue|quota`, `seqae sweep priority` ----------------------
def test_the_command_line_shows_the_queue_and_refuses_others_priorities_and_quotas(tmp_path, monkeypatch, capsys):
    from seqae.cli.main import main

    workspace = tmp_path / "ws"
    workspace.mkdir()
    monkeypatch.delenv("SEQAE_OPTUNA_STORAGE", raising=False)
    monkeypatch.setenv(USER, "ann")
    assert main(["cluster", "queue", "--workspace", str(workspace)]) == 0
    assert "no sweep has run" in capsys.readouterr().out
    queue = Q.Queue(f"sqlite:///{workspace / 'optuna.db'}")
    queue.join(entry("hers", "ann", arrived=1.0, training=3))
    queue.join(entry("his", "bob", priority=2, arrived=2.0))
    monkeypatch.setenv(USER, "bob")
    for argv, says in (
        (["sweep", "priority", "hers", "9"], "sweep 'hers' belongs to ann; bob may not change its priority"),
        (["cluster", "quota", "ann", "--cpus", "1"], "quotas are set by an MLflow admin"),
    ):
        code = main([*argv, "--workspace", str(workspace)])
        assert_refused(code, capsys.readouterr().err, says, created=(workspace / "sweeps",))
    assert queue.entry("hers").priority == 0 and queue.quotas() == {}
    assert main(["sweep", "priority", "his", "1", "--workspace", str(workspace)]) == 0
    assert "sweep his: priority 1" in capsys.readouterr().out
    assert main(["cluster", "queue", "--workspace", str(workspace)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:5] == ["SWEEP", "USER", "PRIORITY", "WEIGHT", "STATE"]
    assert table[1].split()[:6] == ["his", "bob", "1", "1", "queued", "0/4/-"]  # the higher priority first
    assert table[2].split()[:6] == ["hers", "ann", "0", "1", "running", "3/0/-"]
    monkeypatch.setenv(USER, ADMIN)
    assert main(["cluster", "quota", "bob", "--cpus", "2", "--workspace", str(workspace)]) == 0
    assert main(["cluster", "queue", "--json", "--workspace", str(workspace)]) == 0
    import json

    his = next(p for p in json.loads(capsys.readouterr().out.splitlines()[-1]) if p["sweep"] == "his")
    assert (his["share"], his["quota"], his["why"]) == (2, {"cpus": 2.0, "gpus": None}, QUOTA)


def test_a_driver_that_died_on_this_host_frees_its_slots_at_once(queue):
    import dataclasses
    import os
    import socket
    import subprocess

    ended = subprocess.Popen(["true"])
    ended.wait()
    here = socket.gethostname()
    queue.join(dataclasses.replace(entry("dead", "ann", training=4), host=here, pid=ended.pid))
    queue.join(dataclasses.replace(entry("alive", "bob", arrived=1.0), host=here, pid=os.getpid()))
    queue.join(dataclasses.replace(entry("elsewhere", "cy", arrived=2.0), host="another-host", pid=ended.pid))
    assert {k: s.slots for k, s in queue.shares().items()} == {"alive": 2, "elsewhere": 2}
    dead = next(p for p in queue.view() if p.sweep == "dead")
    assert (dead.state, dead.held, dead.share) == (Q.STOPPED, 0, 0)  # its last beat's 4 trials are gone with it


# -- weights: the sweep file's `weight`, `seqae sweep submit --weight` ----------------------------
def test_weights_1_and_3_on_4_slots_get_1_and_3_and_the_queue_shows_them(tmp_path, monkeypatch, capsys):
    from seqae.cli.main import main

    workspace = tmp_path / "ws"
    workspace.mkdir()
    monkeypatch.delenv("SEQAE_OPTUNA_STORAGE", raising=False)
    queue = Q.Queue(f"sqlite:///{workspace / 'optuna.db'}")
    queue.join(entry("light", "ann", arrived=1.0, weight=1.0))
    queue.join(entry("heavy", "bob", arrived=2.0, weight=3.0))
    assert {k: s.slots for k, s in queue.shares().items()} == {"light": 1, "heavy": 3}
    assert main(["cluster", "queue", "--workspace", str(workspace)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert (rows["light"][3], rows["light"][5]) == ("1", "0/1/-")
    assert (rows["heavy"][3], rows["heavy"][5]) == ("3", "0/3/-")


@pytest.mark.parametrize(
    "argv, says",
    [
        pytest.param(["--weight", "0"], "weight", id="zero"),
        pytest.param(["--weight", "-1"], "weight", id="negative"),
        pytest.param(["--weight", "lots"], "weight", id="not-a-number"),
        pytest.param(["--set", "weight=inf"], "weight", id="infinite"),
    ],
)
def test_a_bad_weight_is_refused_in_one_line_before_anything_is_submitted(tmp_path, monkeypatch, capsys, argv, says):
    from seqae.cli.main import main
    from tests.test_status import QUICKSTART

    workspace = tmp_path / "ws"
    monkeypatch.delenv("SEQAE_RAY_ADDRESS", raising=False)
    code = main(["sweep", "submit", str(QUICKSTART), *argv, "--workspace", str(workspace)])
    assert_refused(code, capsys.readouterr().err, says, created=(workspace / "sweeps",))


def test_a_new_sweeps_share_is_what_the_queue_would_give_it_now(queue):
    assert queue.would_grant(claim("new")) is None  # no sweep ran here: the queue knows no capacity
    queue.join(entry("a", "ann", arrived=1.0, training=4))
    share, cluster = queue.would_grant(claim("new", user="bob", demand=4, arrived=time.time()))
    assert (share.slots, share.why, cluster) == (2, FAIR, Capacity(4.0))
    assert queue.would_grant(claim("new", user="bob", priority=1, demand=4)) == (Share(4), Capacity(4.0))
    assert queue.would_grant(claim("new", user="bob", weight=3.0, demand=4))[0].slots == 3
    queue.leave("a", "complete", 8)  # an empty cluster: its capacity as its last driver saw it
    assert queue.would_grant(claim("new", demand=8)) == (Share(4, CAPACITY), Capacity(4.0))


def test_a_queue_made_before_weights_and_etas_is_read_and_then_upgraded(tmp_path):
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    engine = sa.create_engine(url)
    old = [c for c in Q._SWEEPS.columns if c.name not in ("weight", "eta_end")]
    sa.Table(
        Q._SWEEPS.name, sa.MetaData(), *(sa.Column(c.name, c.type, primary_key=c.primary_key) for c in old)
    ).create(engine)
    before = entry("a", "ann")
    with engine.begin() as db:
        db.execute(
            sa.text(
                f"INSERT INTO seqae_queue ({', '.join(c.name for c in old)}) VALUES "
                f"({', '.join(':' + c.name for c in old)})"
            ),
            {c.name: getattr(before, c.name) for c in old},
        )
    engine.dispose()
    assert Q.Queue(url, create=False).entries() == [before]  # a reader writes nothing, and reads the defaults
    queue = Q.Queue(url)  # a driver's: adds the columns
    queue.set_eta("a", 123.0)
    assert (queue.entry("a").weight, queue.entry("a").eta_end) == (1.0, 123.0)


def test_status_shows_where_a_sweep_that_waits_for_its_first_slot_stands(tmp_path):
    """A sweep given no slot has proposed no trial yet: its status still says why it waits."""
    import dataclasses
    import os
    import socket

    from sweeps.results.status import trials_view
    from sweeps.spec import sweep as spec_lib
    from sweeps.stores.search import open_study
    from sweeps.stores.workspace import Backends
    from tests.conftest import WIKI_MINI
    from tests.sweep_helpers import STUDIES

    spec = spec_lib.load(STUDIES / "quickstart.yaml", [f"data.path={WIKI_MINI}", "trials.total=4"])
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    open_study(spec, url, "late", 4, spec.fingerprint())  # as its driver created it, before any trial
    queue, here = Q.Queue(url), {"host": socket.gethostname(), "pid": os.getpid()}
    queue.join(dataclasses.replace(entry("urgent", "ann", priority=5, training=4, arrived=1.0), **here))
    queue.join(dataclasses.replace(entry("late", "bob", arrived=2.0), **here))
    view = trials_view(spec, Backends(f"sqlite:///{tmp_path / 'mlflow.db'}", url, str(tmp_path)), "late", 4)
    assert view.trials_by_state == {"NOT_STARTED": 4}
    assert view.queue is not None, "no place in the queue shown for a sweep that waits for its first slot"
    assert (view.queue.state, view.queue.place, view.queue.share, view.queue.why) == (Q.QUEUED, 1, 0, PRIORITY)
