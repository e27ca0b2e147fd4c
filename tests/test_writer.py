"""The driver's MLflow writer (``sweeps.stores.writer.Writer``): calls run in order on one thread, an outage
of the service is waited out and every write kept meanwhile lands afterwards, a write that cannot
succeed is dropped alone, and ``close`` says how many writes did not land.

Real calls on a real thread, with waits of milliseconds; the tests synchronise on events set by
the calls, and on ``close``, which waits for the queue to drain.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from sweeps.stores.writer import Writer

FAST = {"first_wait": 0.001, "max_wait": 0.01}
# How long a test waits for the writer's thread to get somewhere: a bound, never a measurement (each
# wait returns as soon as its event is set, so a passing run waits milliseconds), and a minute, not
# 5 s, so a loaded machine that runs the thread late does not fail a test that the writer passes.
PATIENCE = 60.0


def offline(exc: BaseException) -> bool:
    """What the driver treats as the server being away: a connection-level error."""
    return isinstance(exc, OSError)


class Service:
    """A stand-in for the tracking server, in-process: it records every write that lands and can be
    down (every call raises ``ConnectionError``) until ``back`` is set."""

    def __init__(self) -> None:
        self.landed: list[str] = []
        self.attempts: dict[str, int] = {}
        self.back = threading.Event()
        self.back.set()
        self.refused = threading.Event()  # set at the first call refused while down

    def write(self, what: str, fails: int = 0, error: BaseException | None = None) -> Callable[[], None]:
        """A call that raises ``error`` on its first ``fails`` attempts (and while the service is down)."""

        def call() -> None:
            self.attempts[what] = self.attempts.get(what, 0) + 1
            if not self.back.is_set():
                self.refused.set()
                raise ConnectionError("[Errno 111] Connection refused")
            if self.attempts[what] <= fails:
                raise error if error is not None else ConnectionError("connection reset")
            self.landed.append(what)

        return call


@pytest.fixture
def recoveries() -> list[tuple[int, float]]:
    return []


@pytest.fixture
def service():
    service = Service()
    yield service
    service.back.set()  # a failed test leaves no writer retrying for the rest of the session


@pytest.fixture
def make_writer(recoveries: list[tuple[int, float]]):
    def make() -> Writer:
        return Writer(offline, lambda number, seconds: recoveries.append((number, seconds)), **FAST)

    return make


def test_calls_run_in_submission_order_on_one_background_thread(make_writer, recoveries):
    writer = make_writer()
    seen: list[tuple[int, str]] = []
    for i in range(50):
        writer.submit(f"write {i}", lambda i=i: seen.append((i, threading.current_thread().name)))

    assert writer.close(timeout=PATIENCE) == 0
    assert [i for i, _ in seen] == list(range(50))
    assert {name for _, name in seen} == {"seqae-mlflow-writer"}
    assert threading.current_thread().name not in {name for _, name in seen}
    assert writer.outages == [] and writer.failed == [] and recoveries == []


def test_an_outage_is_waited_out_and_the_writes_kept_meanwhile_land_in_order(make_writer, service, recoveries):
    writer = make_writer()
    service.back.clear()  # the server goes away before the first write
    writer.submit("logging epoch 1", service.write("epoch 1"))
    assert service.refused.wait(PATIENCE), "the first write was never attempted"
    for n in (2, 3, 4):  # queued while the writer is retrying epoch 1
        writer.submit(f"logging epoch {n}", service.write(f"epoch {n}"))
    assert service.landed == []
    service.back.set()

    assert writer.close(timeout=PATIENCE) == 0
    assert service.landed == ["epoch 1", "epoch 2", "epoch 3", "epoch 4"]
    assert service.attempts["epoch 1"] >= 2  # refused at least once, then retried until it landed
    assert {service.attempts[f"epoch {n}"] for n in (2, 3, 4)} == {1}  # the rest went through first time
    assert len(writer.outages) == 1 and writer.outages[0] >= 0
    assert recoveries == [(1, writer.outages[0])]  # recovered once, numbered, with the outage's length
    assert writer.outage_since is None and writer.failed == []


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ConnectionError("connection reset"), id="ConnectionError"),
        pytest.param(TimeoutError("read timed out"), id="TimeoutError"),
        pytest.param(OSError(101, "Network is unreachable"), id="OSError"),
    ],
)
def test_each_outage_is_recorded_once_and_reported_once(make_writer, service, recoveries, error):
    writer = make_writer()
    writer.submit("a", service.write("a", fails=3, error=error))  # outage 1: three refusals
    writer.submit("b", service.write("b"))
    writer.submit("c", service.write("c", fails=2, error=error))  # outage 2: two refusals
    writer.submit("d", service.write("d"))

    assert writer.close(timeout=PATIENCE) == 0
    assert service.landed == ["a", "b", "c", "d"]
    assert service.attempts == {"a": 4, "b": 1, "c": 3, "d": 1}
    assert len(writer.outages) == 2
    assert recoveries == list(enumerate(writer.outages, 1))  # numbered, so a retried record is not a new one
    assert writer.failed == []


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ValueError("param 'lr' already logged with a different value"), id="ValueError"),
        pytest.param(KeyError("run_id"), id="KeyError"),
        pytest.param(RuntimeError("INVALID_PARAMETER_VALUE"), id="RuntimeError"),
    ],
)
def test_a_write_that_cannot_succeed_is_dropped_alone(make_writer, service, recoveries, error):
    writer = make_writer()
    writer.submit("logging params", service.write("params"))
    writer.submit("logging a bad param", service.write("bad", fails=99, error=error))
    writer.submit("logging epoch 1", service.write("epoch 1"))

    assert writer.close(timeout=PATIENCE) == 0  # the dropped write counts as done: it will never land
    assert service.landed == ["params", "epoch 1"]
    assert service.attempts["bad"] == 1  # not retried
    assert writer.failed == [f"logging a bad param: {error}"]
    assert writer.outages == [] and recoveries == []


def test_close_returns_how_many_writes_are_left_while_the_service_stays_away(make_writer, service, recoveries):
    writer = make_writer()
    service.back.clear()
    drained = threading.Event()
    writer.submit("logging epoch 1", service.write("epoch 1"))
    writer.submit("logging epoch 2", service.write("epoch 2"))
    writer.submit("marking the run finished", drained.set)
    assert service.refused.wait(PATIENCE), "the first write was never attempted"

    assert writer.close(timeout=0.2) == 3  # a deadline, not a measurement: nothing can land before it
    assert service.landed == [] and not drained.is_set()
    assert service.attempts["epoch 1"] >= 1 and "epoch 2" not in service.attempts
    assert writer.outages == [] and writer.outage_since is not None

    # The writes are kept, not lost: once the server answers they still land, in order.
    service.back.set()
    assert drained.wait(PATIENCE), "the writes kept through the outage never landed"
    assert service.landed == ["epoch 1", "epoch 2"]
    assert len(writer.outages) == 1


def test_an_outage_ends_when_the_service_answers_even_with_an_error(make_writer, service, recoveries):
    """A write refused while the server was away, then rejected once it answers: the outage is
    over (and recorded) although that write never lands."""
    writer = make_writer()
    attempts = []

    def away_then_rejected() -> None:
        attempts.append(1)
        raise ConnectionError("connection refused") if len(attempts) < 3 else ValueError("bad value")

    writer.submit("logging a bad param", away_then_rejected)
    writer.submit("logging epoch 1", service.write("epoch 1"))
    assert writer.close(timeout=PATIENCE) == 0
    assert len(attempts) == 3 and service.landed == ["epoch 1"]
    assert writer.failed == ["logging a bad param: bad value"]
    assert len(writer.outages) == 1 and writer.outage_since is None and len(recoveries) == 1
