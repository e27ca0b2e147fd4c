"""pydantic's validation errors as seqae says them: one line, ``source: key=value must be ...``,
with the key's full path as the sweep file writes it."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from seqae_errors import ConfigError


def reason(exc: ValidationError, source: str) -> str:
    """The first problem pydantic found, as ``source: key=value must be ...`` with the key's full
    path; a check of seqae's own (a ConfigError) as it said it."""
    error = exc.errors()[0]
    if isinstance((error.get("ctx") or {}).get("error"), ConfigError):
        return str(error["ctx"]["error"])
    return f"{source}: {_problem(error)}"


def _problem(error: Any) -> str:
    where = _path(error["loc"])
    if error["type"] == "extra_forbidden":  # the key as written: a dotted one (`ata.input_len`) is one key
        *parents, key = error["loc"]
        return f"unknown key {key!r}" + (f" in {_path(parents)}" if parents else "")
    message = re.sub(r"^Value error, |(?<= or) instance of \w+", "", error["msg"])
    message = (
        message.replace("Input should be", "must be")
        .replace("Value should", "must")
        .replace("a valid dictionary or", "a mapping")
    )
    return f"{where}: {message}" if error["type"] == "value_error" else f"{where}={error['input']!r} {message}"


def _path(loc: Any) -> str:
    """pydantic's location of an error as a key's path: ``search.train.lr.low``, ``objective[0].mode``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
