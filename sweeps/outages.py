"""How seqae waits out a service that is away: one retry policy for the MLflow writer
(:mod:`sweeps.writer`) and the Optuna storage (:mod:`sweeps.study_storage`).

tenacity retries a call while ``retryable`` says its error is an outage, not a bug, with waits
that double from ``first_wait`` up to ``max_wait`` seconds: a service that is back is found within
``max_wait`` seconds, and one that stays away costs a request every ``max_wait`` seconds.
"""

from __future__ import annotations

import os
from typing import Callable

import tenacity

FIRST_WAIT, MAX_WAIT = 0.5, 8.0


def retry_seconds() -> float:
    """How long a call a driver cannot go on without waits for its service to answer again
    (``SEQAE_STORAGE_RETRY_SECONDS``): the study's database, or MLflow while a driver starts."""
    return float(os.environ.get("SEQAE_STORAGE_RETRY_SECONDS", "120"))


def first_line(error: BaseException) -> str:
    """What an error says, in one line a person reads in a log."""
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def patiently(retryable: Callable[[BaseException], bool], away: Callable[[tenacity.RetryCallState], None],
              seconds: float | None = None, first_wait: float = FIRST_WAIT, max_wait: float = MAX_WAIT) -> tenacity.Retrying:
    """Retries while ``retryable(error)``, for ``seconds`` at most (None: until the service answers),
    calling ``away(state)`` before each wait. When the limit is reached, or the error is not an
    outage, the last error is raised as it was."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(retryable),
        wait=tenacity.wait_exponential(multiplier=first_wait, min=first_wait, max=max_wait),
        stop=tenacity.stop_never if seconds is None else tenacity.stop_after_delay(seconds),
        before_sleep=away, reraise=True)
