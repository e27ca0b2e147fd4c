"""Sweep files: what a sweep runs, checked before anything is created.

A sweep file is YAML with these top-level keys (every study in ``sweeps/studies`` is an example):

    description  free text
    config       the base config, with the same keys as ``seqae train --config``
    grid         cartesian axes: ``{config key: [values]}``; ``{"key_a,key_b": [[a, b], ...]}`` zips keys
    search       Optuna distributions: ``{config key: {type: loguniform|uniform|int|categorical, ...}}``
    objective    ``{metric, mode}``, or a list of them for a multi-objective sweep
    trials       ``{per_cell: N}`` (N trials in each grid cell) or ``{total: N}``
    sampler      ``{type: tpe|random|nsga2, seed}``; TPE by default, NSGA-II for multi-objective
    scheduler    ``{type: none|asha, grace_period, reduction_factor}``
    resources    ``{cpu, gpu}`` per trial; fractional GPUs are allowed
    max_concurrent, retries
    profiles     named blocks of overrides, e.g. ``{laptop: {description, data.max_pages: 300, ...}}``:
                 ``--profile laptop`` (or ``--set profile=laptop``) applies one before any ``--set``

Every error is a :class:`~seqae_errors.ConfigError` naming the file, the key and the value.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from seqae_core import metrics as M
from seqae_core.config import KEYS, accepts_float, build, coerce, flatten, parse_sets
from seqae_errors import ConfigError

MAX_FILE_BYTES = 256 * 1024  # sweep files are documents, not data
TOP_KEYS = ("description", "config", "grid", "search", "objective", "trials", "sampler", "scheduler",
            "resources", "max_concurrent", "retries", "profiles", "profile")
DISTRIBUTIONS = {
    "loguniform": ("low", "high"),
    "uniform": ("low", "high"),
    "int": ("low", "high", "step", "log"),
    "categorical": ("choices",),
}
SAMPLERS = ("tpe", "random", "nsga2")
SCHEDULERS = ("none", "asha")


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without anchors and aliases, so a small file cannot expand into a huge one."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.YAMLError(f"aliases are not allowed in sweep files (line {event.start_mark.line + 1})")
        return super().compose_node(parent, index)


@dataclass(frozen=True)
class Distribution:
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    step: int | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "categorical":
            return {"type": "categorical", "choices": list(self.choices)}
        out: dict[str, Any] = {"type": self.kind, "low": self.low, "high": self.high}
        if self.kind == "int":
            out.update(step=self.step, log=self.log)
        return out


@dataclass(frozen=True)
class Objective:
    metric: str
    mode: str


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep file (with ``--set`` overrides applied)."""

    source: str
    base: dict[str, Any]
    grid: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    search: dict[str, Distribution] = field(default_factory=dict)
    objectives: tuple[Objective, ...] = (Objective(M.VAL_TOKEN_ACCURACY, "max"),)
    per_cell: int | None = None
    total: int | None = None
    sampler: str = "tpe"
    seed: int = 0
    scheduler: str = "none"
    grace_period: int = 1
    reduction_factor: int = 2
    cpu: float = 1.0
    gpu: float = 0.0
    max_concurrent: int = 1
    retries: int = 0
    description: str = ""
    profile: str | None = None  # the profile applied, if any

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    def cells(self) -> list[dict[str, Any]]:
        """The grid's cells in a fixed order (one empty cell without a grid). An axis named
        ``"a,b"`` is zipped: its values are pairs that vary together."""
        cells = []
        for combination in itertools.product(*self.grid.values()):
            cell: dict[str, Any] = {}
            for axis, value in zip(self.grid, combination):
                cell.update(zip(axis.split(","), value) if "," in axis else [(axis, value)])
            cells.append(cell)
        return cells

    def grid_keys(self) -> dict[str, tuple[Any, ...]]:
        """Each config key the grid sets, with its distinct values in order."""
        keys: dict[str, list[Any]] = {}
        for cell in self.cells():
            for key, value in cell.items():
                if value not in keys.setdefault(key, []):
                    keys[key].append(value)
        return {k: tuple(v) for k, v in keys.items()}

    def planned_trials(self) -> int:
        return self.total if self.total is not None else (self.per_cell or 1) * len(self.cells())

    def to_dict(self) -> dict[str, Any]:
        """The canonical form stored with a sweep: it reloads to the same spec and is diffed on resume."""
        return ({"profile": self.profile} if self.profile else {}) | {
            "description": self.description,
            "config": dict(sorted(self.base.items())),
            "grid": {k: [list(x) if isinstance(x, tuple) else x for x in v] for k, v in self.grid.items()},
            "search": {k: d.to_dict() for k, d in self.search.items()},
            "objective": [{"metric": o.metric, "mode": o.mode} for o in self.objectives],
            "trials": {"per_cell": self.per_cell} if self.total is None else {"total": self.total},
            "sampler": {"type": self.sampler, "seed": self.seed},
            "scheduler": {"type": self.scheduler, "grace_period": self.grace_period,
                          "reduction_factor": self.reduction_factor},
            "resources": {"cpu": self.cpu, "gpu": self.gpu},
            "max_concurrent": self.max_concurrent,
            "retries": self.retries,
        }

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def read_document(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in ``path``, refusing files that are large or use aliases."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if size > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: {size} bytes is too large for a sweep file (limit {MAX_FILE_BYTES})")
    try:
        document = yaml.load(path.read_text(), Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a valid sweep file: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: a sweep file is a mapping of {', '.join(TOP_KEYS)}; got {type(document).__name__}")
    return document


def apply_sets(document: dict[str, Any], sets: list[str] | tuple[str, ...], source: str) -> dict[str, Any]:
    """``--set`` overrides on a sweep document.

    ``data.* / model.* / train.*`` pin a config key: it is set in ``config`` and leaves the grid
    and the search. Other keys address the document itself: ``trials.total=2``,
    ``max_concurrent=2``, ``grid.data.input_len=[16,32]``, ``search.train.lr={...}``, and
    ``profile=laptop`` applies the file's profile of that name (the CLI's ``--profile``)."""
    return _override(document, parse_sets(sets), source, "--set ")


def _override(document: dict[str, Any], overrides: dict[str, Any], source: str, label: str) -> dict[str, Any]:
    doc = copy.deepcopy(document)
    for key, value in overrides.items():
        where = f"{label}{key}"
        section = key.split(".", 1)[0]
        if key == "profile":
            doc = _apply_profile(doc, value, source)
        elif key in KEYS or section in ("data", "model", "train"):
            doc.setdefault("config", {})
            if not isinstance(doc["config"], dict):
                raise ConfigError(f"{source}: config must be a mapping")
            doc["config"] = {**flatten(doc["config"], source), key: value}
            for axis in ("grid", "search"):
                if isinstance(doc.get(axis), dict):
                    doc[axis].pop(key, None)
                    zipped = [a for a in doc[axis] if key in str(a).split(",")]
                    if zipped:
                        raise ConfigError(f"{where}: {key} is part of the zipped grid axis {zipped[0]!r} in "
                                          f"{source}; set the whole axis with grid.{zipped[0]}=[[...]]")
        elif section in ("grid", "search") and "." in key:
            doc.setdefault(section, {})
            if not isinstance(doc[section], dict):
                raise ConfigError(f"{source}: {section} must be a mapping")
            doc[section][key.split(".", 1)[1]] = value
        else:
            node = doc
            *parents, last = key.split(".")
            for name in parents:
                node = node.setdefault(name, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"{where}: {name} is not a mapping in {source}")
            node[last] = value
    return doc


def _apply_profile(doc: dict[str, Any], name: Any, source: str) -> dict[str, Any]:
    """The document with its profile ``name`` applied: the profile's keys are overrides of the same
    form as ``--set``; its ``description`` is added to the sweep's."""
    profiles = doc.pop("profiles", None) or {}
    if not isinstance(profiles, dict):
        raise ConfigError(f"{source}: profiles must map names to blocks of overrides, got {profiles!r}")
    if doc.get("profile"):
        raise ConfigError(f"{source}: profile={name!r}: profile {doc['profile']!r} is already applied; one at a time")
    if name not in profiles:
        raise ConfigError(f"{source}: profile={name!r} is not defined; this file's profiles: "
                          f"{', '.join(map(str, profiles)) or 'none'}")
    overrides = dict(_mapping(profiles[name], f"profiles.{name}", source, None))
    note = overrides.pop("description", "")
    if not isinstance(note, str):
        raise ConfigError(f"{source}: profiles.{name}.description must be text")
    doc = _override(doc, overrides, source, f"{source}: profiles.{name}.")
    doc["profile"] = name
    doc["description"] = f"{doc.get('description', '')} [profile {name}: {note}]" if note else doc.get("description", "")
    return doc


def load(path: str | Path, sets: list[str] | tuple[str, ...] = ()) -> SweepSpec:
    """Read, override and validate a sweep file."""
    source = str(path)
    return parse(apply_sets(read_document(path), sets, source), source)


def local_path(value: str) -> str:
    """A relative ``data.path`` naming something here, made absolute: trials run in Ray's own
    working directory or on another node, where the user's relative path means nothing. A name
    that is not a local path (a Hub dataset such as ``wikimedia/wikipedia``) stays as it is."""
    path = Path(value).expanduser()
    return str(path.resolve()) if not path.is_absolute() and path.exists() else value


def parse(doc: dict[str, Any], source: str) -> SweepSpec:
    """Validate a sweep document (the mapping in a file, or :meth:`SweepSpec.to_dict`)."""
    for key in doc:
        if key not in TOP_KEYS:
            raise ConfigError(f"{source}: unknown key {key!r}; a sweep file has {', '.join(TOP_KEYS)}")

    profile = doc.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ConfigError(f"{source}: profile={profile!r} must be the name of a profile")
    if doc.get("profiles") is not None:  # every profile must give a valid sweep, whichever is run
        for name in _mapping(doc["profiles"], "profiles", source, None):
            parse(_apply_profile(copy.deepcopy(doc), name, source), source)
    base = {k: coerce(k, v, f"{source}: config") for k, v in flatten(doc.get("config") or {}, f"{source}: config").items()}
    if isinstance(base.get("data.path"), str):
        base["data.path"] = local_path(base["data.path"])
    grid = _grid(doc.get("grid") or {}, source)
    search = _search(doc.get("search") or {}, source)
    grid_keys = [k for axis in grid for k in axis.split(",")]
    if len(set(grid_keys)) != len(grid_keys):
        raise ConfigError(f"{source}: a config key appears in two grid axes: {grid_keys}")
    both = sorted(set(grid_keys) & set(search))
    if both:
        raise ConfigError(f"{source}: {both[0]} is in both grid and search; a key is either a grid axis or searched")

    objectives = _objectives(doc.get("objective", {"metric": M.VAL_TOKEN_ACCURACY, "mode": "max"}), source)
    trials = _mapping(doc.get("trials", {"per_cell": 1}), "trials", source, ("per_cell", "total"))
    if len(trials) != 1:
        raise ConfigError(f"{source}: trials must have exactly one of per_cell or total, got {trials!r}")
    (trials_key, count), = trials.items()
    _positive_int(count, f"trials.{trials_key}", source)

    default_sampler = "nsga2" if len(objectives) > 1 else "tpe"
    sampler = _mapping(doc.get("sampler", {}), "sampler", source, ("type", "seed"))
    sampler_type = sampler.get("type", default_sampler)
    if sampler_type not in SAMPLERS:
        raise ConfigError(f"{source}: sampler.type={sampler_type!r} must be one of {', '.join(SAMPLERS)}")
    seed = sampler.get("seed", 0)
    _int(seed, "sampler.seed", source)

    scheduler = _mapping(doc.get("scheduler", {}), "scheduler", source, ("type", "grace_period", "reduction_factor"))
    scheduler_type = scheduler.get("type") or "none"  # `--set scheduler.type=none` arrives as None
    if scheduler_type not in SCHEDULERS:
        raise ConfigError(f"{source}: scheduler.type={scheduler_type!r} must be one of {', '.join(SCHEDULERS)}")
    grace = scheduler.get("grace_period", 1)
    reduction = scheduler.get("reduction_factor", 2)
    _positive_int(grace, "scheduler.grace_period", source)
    _positive_int(reduction, "scheduler.reduction_factor", source)
    if reduction < 2:
        raise ConfigError(f"{source}: scheduler.reduction_factor={reduction} must be at least 2")
    if scheduler_type == "asha" and len(objectives) > 1:
        raise ConfigError(f"{source}: scheduler.type='asha' needs one objective; this sweep has {len(objectives)}")

    resources = _mapping(doc.get("resources", {}), "resources", source, ("cpu", "gpu"))
    cpu, gpu = resources.get("cpu", 1), resources.get("gpu", 0)
    _number(cpu, "resources.cpu", source, minimum=0.0, inclusive=False)
    _number(gpu, "resources.gpu", source, minimum=0.0, inclusive=True)
    if gpu > 1 and not float(gpu).is_integer():
        raise ConfigError(f"{source}: resources.gpu={gpu}: above 1, GPUs per trial must be a whole number")
    max_concurrent = doc.get("max_concurrent", 1)
    retries = doc.get("retries", 0)
    _positive_int(max_concurrent, "max_concurrent", source)
    _int(retries, "retries", source, minimum=0)
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{source}: description must be text")

    spec = SweepSpec(
        source=source, base=base, grid=grid, search=search, objectives=objectives,
        per_cell=count if trials_key == "per_cell" else None, total=count if trials_key == "total" else None,
        sampler=sampler_type, seed=seed, scheduler=scheduler_type, grace_period=grace, reduction_factor=reduction,
        cpu=float(cpu), gpu=float(gpu), max_concurrent=max_concurrent, retries=retries, description=description,
        profile=profile,
    )
    _check_trial_configs(spec)
    return spec


def trial_layers(source: str, base: dict[str, Any], params: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The config layers of one trial: the base config under its grid cell's and searched values."""
    return [(f"{source}: config", base), (f"{source}: trial parameters", params)]


def _check_trial_configs(spec: SweepSpec) -> None:
    """Every grid cell must give a valid config, alone and with each searched value (each
    categorical choice, each numeric bound) set on it. Combinations of several searched values
    are not tried: a trial whose combination is invalid fails on its own, and the sweep goes on."""
    probes: list[dict[str, Any]] = [{}]
    for key, dist in spec.search.items():
        values = dist.choices if dist.kind == "categorical" else (dist.low, dist.high)
        probes += [{key: v} for v in values]
    for cell in spec.cells():
        for probe in probes:
            try:
                build(trial_layers(spec.source, spec.base, {**cell, **probe}))
            except ConfigError as exc:
                where = " and ".join(f"{k}={v!r}" for k, v in {**cell, **probe}.items()) or "the base config"
                raise ConfigError(f"{exc} (with {where})") from None


def _grid(grid: Any, source: str) -> dict[str, tuple[Any, ...]]:
    if not isinstance(grid, dict):
        raise ConfigError(f"{source}: grid must map config keys to lists of values, got {grid!r}")
    axes: dict[str, tuple[Any, ...]] = {}
    for axis, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{source}: grid.{axis}={values!r} must be a non-empty list of values")
        keys = axis.split(",")
        if len(keys) == 1:
            coerced: tuple[Any, ...] = tuple(coerce(axis, v, f"{source}: grid.{axis}") for v in values)
        else:
            rows = []
            for value in values:
                if not isinstance(value, list) or len(value) != len(keys):
                    raise ConfigError(f"{source}: grid.{axis}: {value!r} must be a list of {len(keys)} values, "
                                      f"one for each of {', '.join(keys)}")
                rows.append(tuple(coerce(k, v, f"{source}: grid.{axis}") for k, v in zip(keys, value)))
            coerced = tuple(rows)
        if len(set(map(repr, coerced))) != len(coerced):
            raise ConfigError(f"{source}: grid.{axis}={values!r} repeats a value")
        axes[axis] = coerced
    return axes


def _search(search: Any, source: str) -> dict[str, Distribution]:
    if not isinstance(search, dict):
        raise ConfigError(f"{source}: search must map config keys to distributions, got {search!r}")
    out = {}
    for key, spec in search.items():
        where = f"search.{key}"
        if key not in KEYS:
            raise ConfigError(f"{source}: search: unknown config key {key!r}")
        spec = _mapping(spec, where, source, ("type", "low", "high", "step", "log", "choices"))
        kind = spec.get("type")
        if kind not in DISTRIBUTIONS:
            raise ConfigError(f"{source}: {where}.type={kind!r} must be one of {', '.join(DISTRIBUTIONS)}")
        extra = set(spec) - {"type", *DISTRIBUTIONS[kind]}
        if extra:
            raise ConfigError(f"{source}: {where}: {sorted(extra)[0]!r} does not apply to type {kind!r}")
        if kind == "categorical":
            choices = spec.get("choices")
            if not isinstance(choices, list) or not choices:
                raise ConfigError(f"{source}: {where}.choices={choices!r} must be a non-empty list")
            values = tuple(coerce(key, c, f"{source}: {where}.choices") for c in choices)
            if len(set(map(repr, values))) != len(values):
                raise ConfigError(f"{source}: {where}.choices={choices!r} repeats a value")
            out[key] = Distribution("categorical", choices=values)
            continue
        if kind != "int" and not accepts_float(key):
            raise ConfigError(f"{source}: {where}.type={kind!r} samples fractions, but {key} is an integer; "
                              "use type: int")
        low, high = spec.get("low"), spec.get("high")
        for name, value in (("low", low), ("high", high)):
            if kind == "int":
                _int(value, f"{where}.{name}", source)
            else:
                _number(value, f"{where}.{name}", source)
        assert low is not None and high is not None  # checked just above
        if low > high:
            raise ConfigError(f"{source}: {where}: low={low} is greater than high={high}")
        log = kind == "loguniform" or bool(spec.get("log", False))
        if log and low <= 0:
            raise ConfigError(f"{source}: {where}: low={low} must be positive on a log scale")
        step = spec.get("step", 1) if kind == "int" else None
        if kind == "int":
            _positive_int(step, f"{where}.step", source)
            if not isinstance(spec.get("log", False), bool):
                raise ConfigError(f"{source}: {where}.log={spec.get('log')!r} must be true or false")
            if log and step != 1:
                raise ConfigError(f"{source}: {where}: step={step} cannot be combined with log: true")
        coerce(key, low, f"{source}: {where}.low")
        coerce(key, high, f"{source}: {where}.high")
        out[key] = Distribution(kind, low=low, high=high, step=step, log=log)
    return out


def _objectives(value: Any, source: str) -> tuple[Objective, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ConfigError(f"{source}: objective must name at least one metric")
    out = []
    for i, item in enumerate(items):
        where = "objective" if not isinstance(value, list) else f"objective[{i}]"
        item = _mapping(item, where, source, ("metric", "mode"))
        metric, mode = item.get("metric"), item.get("mode")
        if metric not in M.OBJECTIVES:
            raise ConfigError(f"{source}: {where}.metric={metric!r} is not reported by the trainer; "
                              f"choose from {', '.join(M.OBJECTIVES)}")
        if mode not in ("min", "max"):
            raise ConfigError(f"{source}: {where}.mode={mode!r} must be 'min' or 'max'")
        if mode not in M.OBJECTIVES[metric]:
            raise ConfigError(f"{source}: {where}: mode={mode!r} for {metric} optimizes in the wrong direction")
        out.append(Objective(metric, mode))
    if len({o.metric for o in out}) != len(out):
        raise ConfigError(f"{source}: objective names a metric twice")
    return tuple(out)


def _mapping(value: Any, where: str, source: str, allowed: tuple[str, ...] | None) -> dict[str, Any]:
    """``value`` as a mapping whose keys are all ``allowed`` (any keys when None)."""
    if not isinstance(value, dict):
        keys = f" with keys {', '.join(allowed)}" if allowed else ""
        raise ConfigError(f"{source}: {where} must be a mapping{keys}; got {value!r}")
    for key in value:
        if allowed is not None and key not in allowed:
            raise ConfigError(f"{source}: unknown key {where}.{key}; allowed: {', '.join(allowed)}")
    return value


def _int(value: Any, where: str, source: str, minimum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{source}: {where}={value!r} must be an integer")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{source}: {where}={value} must be at least {minimum}")


def _positive_int(value: Any, where: str, source: str) -> None:
    _int(value, where, source)
    if value <= 0:
        raise ConfigError(f"{source}: {where}={value} must be positive")


def _number(value: Any, where: str, source: str, minimum: float | None = None, inclusive: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: {where}={value!r} must be a number")
    if not math.isfinite(value):
        raise ConfigError(f"{source}: {where}={value} must be finite")
    if minimum is not None and (value < minimum or (not inclusive and value == minimum)):
        raise ConfigError(f"{source}: {where}={value} must be {'at least' if inclusive else 'above'} {minimum}")


def diff(stored: SweepSpec, current: SweepSpec) -> str:
    """A unified diff of two specs' canonical YAML; empty when they run the same sweep."""
    a = yaml.safe_dump(stored.to_dict(), sort_keys=True).splitlines()
    b = yaml.safe_dump(current.to_dict(), sort_keys=True).splitlines()
    return "\n".join(difflib.unified_diff(a, b, "stored sweep", current.source, lineterm=""))
