"""A sweep's search space: its grid axes and searched distributions checked against the config
keys they set, and the conditions between them, in the order they are sampled."""

from __future__ import annotations

from typing import Any

from seqae_core.config import KEYS, accepts_float, coerce
from seqae_errors import ConfigError
from sweeps.spec.overrides import mapping
from sweeps.spec.sections import Distribution


def grid_axes(grid: Any, source: str) -> dict[str, tuple[Any, ...]]:
    axes: dict[str, tuple[Any, ...]] = {}
    for axis, values in mapping(grid, "grid", source).items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{source}: grid.{axis}={values!r} must be a non-empty list of values")
        keys = axis.split(",")
        if len(keys) == 1:
            coerced: tuple[Any, ...] = tuple(coerce(axis, v, f"{source}: grid.{axis}") for v in values)
        else:
            rows = []
            for value in values:
                if not isinstance(value, list) or len(value) != len(keys):
                    raise ConfigError(
                        f"{source}: grid.{axis}: {value!r} must be a list of {len(keys)} values, "
                        f"one for each of {', '.join(keys)}"
                    )
                rows.append(tuple(coerce(k, v, f"{source}: grid.{axis}") for k, v in zip(keys, value)))
            coerced = tuple(rows)
        if len(set(map(repr, coerced))) != len(coerced):
            raise ConfigError(f"{source}: grid.{axis}={values!r} repeats a value")
        axes[axis] = coerced
    return axes


def checked_search(search: dict[str, Distribution], source: str) -> dict[str, Distribution]:
    """The distributions, checked against the types of the keys they sample."""
    for key, dist in search.items():
        where = f"{source}: search.{key}"
        if key not in KEYS:
            raise ConfigError(f"{source}: search: unknown config key {key!r}")
        if key == "train.repeats":
            raise ConfigError(
                f"{where}: the number of seeds is how a trial is measured, not a hyperparameter to "
                "search; set it in config (train.repeats: 3) for every trial"
            )
        if dist.type in ("uniform", "loguniform") and not accepts_float(key):
            raise ConfigError(f"{where}.type={dist.type!r} samples fractions, but {key} is an integer; use type: int")
        for value in dist.choices or (dist.low, dist.high):
            coerce(key, value, where)
    return search


def check_conditions(search: dict[str, Distribution], grid: dict[str, tuple[Any, ...]], source: str) -> None:
    """A condition names a grid axis or another searched key, and values that key can take; the
    conditions form no cycle (``sampling_order``)."""
    for key, dist in search.items():
        for other, values in dist.when.items():
            where = f"{source}: search.{key}.when.{other}"
            if not values:
                raise ConfigError(f"{where}: lists no value, so {key} would never be sampled")
            if other in grid:
                impossible = [v for v in values if v not in grid[other]]
            elif other in search and other != key:
                impossible = [v for v in values if not search[other].contains(v)]
            else:
                raise ConfigError(
                    f"{where}: {other} is not a grid axis or another searched key; a condition can only name one"
                )
            if impossible:
                raise ConfigError(f"{where}: {other}={impossible[0]!r} is a value {other} never takes")
    sampling_order(search, set(grid), source)


def sampling_order(search: dict[str, Distribution], grid: set[str], source: str) -> list[str]:
    order: list[str] = []
    placed = set(grid)
    pending = list(search)
    while pending:
        ready = [key for key in pending if set(search[key].when) <= placed]
        if not ready:
            raise ConfigError(
                f"{source}: the conditions of search.{', search.'.join(pending)} name each other in a "
                "cycle; one of them must be sampled unconditionally"
            )
        order += ready
        placed.update(ready)
        pending = [key for key in pending if key not in placed]
    return order
