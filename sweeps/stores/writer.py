"""Calls run in order on one background thread, waiting out outages of the service they write to.

The sweep's driver hands every MLflow write to a :class:`Writer`: Tune's loop never waits on the
server, and writes keep their order. While ``retryable`` says an error is the service being away
(not a bug), the writer keeps the pending calls and retries them, for as long as it takes, by
:func:`sweeps.stores.outages.patiently`; on recovery it delivers them and reports how long the outage
lasted.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import tenacity

from sweeps.stores.outages import FIRST_WAIT, MAX_WAIT, patiently

log = logging.getLogger(__name__)


class Writer:
    """Runs calls in order on one thread, retrying through outages of the service they write to."""

    def __init__(
        self,
        retryable: Callable[[BaseException], bool],
        recovered: Callable[[int, float], None],
        first_wait: float = FIRST_WAIT,
        max_wait: float = MAX_WAIT,
    ) -> None:
        self.retryable, self.recovered = retryable, recovered
        self.first_wait, self.max_wait = first_wait, max_wait
        self._queue: queue.Queue[tuple[str, Callable[[], Any]] | None] = queue.Queue()
        self.outage_since: float | None = None
        self.outages: list[float] = []
        self.failed: list[str] = []  # writes dropped because they raised a non-connection error
        self._thread = threading.Thread(target=self._run, name="seqae-mlflow-writer", daemon=True)
        self._thread.start()

    def submit(self, what: str, call: Callable[[], Any]) -> None:
        self._queue.put((what, call))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            what, call = item
            try:
                self._deliver(what, call)
            finally:
                self._queue.task_done()

    def _deliver(self, what: str, call: Callable[[], Any]) -> None:
        retrying = patiently(
            self.retryable, lambda state: self._away(what, state), first_wait=self.first_wait, max_wait=self.max_wait
        )
        try:
            retrying(call)
        except Exception as exc:  # noqa: BLE001 - not an outage: a write that cannot succeed is reported
            log.exception("write failed while %s", what)
            self.failed.append(f"{what}: {exc}")
        if self.outage_since is not None:  # it answered, if only with an error: the outage is over
            seconds = time.time() - self.outage_since
            self.outages.append(seconds)
            self.outage_since = None
            log.warning("MLflow answers again after %.0f s; delivering the writes kept meanwhile", seconds)
            # Numbered (1, 2, ...) so that a retried record is the same record, not a second outage.
            number = len(self.outages)
            self.submit("recording the outage", lambda: self.recovered(number, seconds))

    def _away(self, what: str, state: tenacity.RetryCallState) -> None:
        if self.outage_since is None:
            self.outage_since = time.time()
            error = state.outcome.exception() if state.outcome else None
            log.warning(
                "MLflow unreachable while %s (%s); keeping the writes until it answers",
                what,
                str(error).splitlines()[0][:200] if error else "?",
            )

    def close(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for every write to land; returns how many did not."""
        deadline = time.time() + timeout
        while self._queue.unfinished_tasks and time.time() < deadline:
            time.sleep(0.1)
        left = self._queue.unfinished_tasks
        self._queue.put(None)
        if left == 0:
            self._thread.join(timeout=5)
        return left
