"""How seqae waits out a service that is away: one retry policy for the MLflow writer
(:mod:`sweeps.stores.writer`), and one wait with a limit for what a driver cannot go on without (the
Optuna storage, :mod:`sweeps.stores.study_storage`; MLflow while a driver starts, :mod:`sweeps.stores.mlflow_access`).

tenacity retries a call while ``retryable`` says its error is an outage, not a bug, with waits
that double from ``first_wait`` up to ``max_wait`` seconds: a service that is back is found within
``max_wait`` seconds, and one that stays away costs a request every ``max_wait`` seconds.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from seqae_errors import StorageUnreachable

FIRST_WAIT, MAX_WAIT = 0.5, 8.0
T = TypeVar("T")


@dataclass(frozen=True)
class Service:
    """A service a driver waits for, as its log lines and its error name it."""

    name: str  # "MLflow"
    where: str  # "MLflow at http://host:5000", credentials redacted
    check: str  # what to look at when it stays away: "check that its server is up and reachable"


def retry_seconds() -> float:
    """How long a call a driver cannot go on without waits for its service to answer again
    (``SEQAE_STORAGE_RETRY_SECONDS``): the study's database, or MLflow while a driver starts."""
    return float(os.environ.get("SEQAE_STORAGE_RETRY_SECONDS", "120"))


def first_line(error: BaseException) -> str:
    """What an error says, in one line a person reads in a log."""
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def patiently(
    retryable: Callable[[BaseException], bool],
    away: Callable[[tenacity.RetryCallState], None],
    seconds: float | None = None,
    first_wait: float = FIRST_WAIT,
    max_wait: float = MAX_WAIT,
) -> tenacity.Retrying:
    """Retries while ``retryable(error)``, for ``seconds`` at most (None: until the service answers),
    calling ``away(state)`` before each wait. When the limit is reached, or the error is not an
    outage, the last error is raised as it was."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(retryable),
        wait=tenacity.wait_exponential(multiplier=first_wait, min=first_wait, max=max_wait),
        stop=tenacity.stop_never if seconds is None else tenacity.stop_after_delay(seconds),
        before_sleep=away,
        reraise=True,
    )


def waited_for(
    service: Service,
    what: str,
    call: Callable[[], T],
    retryable: Callable[[BaseException], bool],
    log: logging.Logger,
    seconds: float,
    again: Callable[[], T] | None = None,
    first_wait: float = FIRST_WAIT,
    max_wait: float = MAX_WAIT,
    outages: list[float] | None = None,
) -> T:
    """``call()``, retried while ``retryable`` says its error is an outage of ``service``, for
    ``seconds`` at most; an attempt after a failed one runs ``again()`` instead when given (the
    failed attempt may have committed). It says once, on ``log``, that the service is away while
    ``what``, and once that it answers again (adding the outage's seconds to ``outages``). Past the
    limit it raises :class:`~seqae_errors.StorageUnreachable`, naming the service and what to check."""
    started = time.time()

    def away(state: tenacity.RetryCallState) -> None:
        if state.attempt_number == 1:
            error = state.outcome.exception() if state.outcome else None
            log.warning(
                "%s did not answer while %s (%s); retrying for up to %.0f s",
                service.where,
                what,
                first_line(error.__cause__ or error) if error else "?",
                seconds,
            )

    try:
        for attempt in patiently(retryable, away, seconds, first_wait, max_wait):
            with attempt:
                first = attempt.retry_state.attempt_number == 1
                result = (call if first or again is None else again)()
                if not first:
                    took = time.time() - started
                    if outages is not None:
                        outages.append(took)
                    log.warning("%s answers again after %.0f s", service.name, took)
                return result
    except Exception as exc:
        if not retryable(exc):
            raise
        error = exc.__cause__ or exc
        raise StorageUnreachable(
            f"{service.where} did not answer for {time.time() - started:.0f} s while {what} "
            f"({type(error).__name__}: {first_line(error)}); {service.check} "
            "(SEQAE_STORAGE_RETRY_SECONDS sets how long seqae waits for it)"
        ) from exc
    raise AssertionError("tenacity stopped without raising")
