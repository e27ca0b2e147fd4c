"""Sweep files: what a sweep runs, checked before anything is created.

A sweep file is YAML; every study in ``sweeps/studies`` is an example. Its keys, their types,
defaults and meanings are stated once, as the field descriptions of the models below, and the
reference (docs/reference/sweep-schema.md) is generated from them.

Every error is a :class:`~seqae_errors.ConfigError` naming the file, the key and the value.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from seqae_core import metrics as M
from seqae_core.config import (
    KEYS,
    Config,
    accepts_float,
    build,
    coerce,
    flatten,
)
from seqae_errors import ConfigError
from sweeps import notify
from sweeps.overrides import apply_profile, apply_sets, mapping, read_document
from sweeps.spec_messages import reason

# A typo such as `trials.total: 100000000` must not start a sweep that cannot end: Optuna's samplers
# read the whole history at every ask, and the report and the MLflow UI list every trial.
MAX_TRIALS = 10_000
MAX_CONCURRENT = 1_000  # trials running at once: far more than one cluster's GPUs


def check_limit(shown: str, value: int, limit: int) -> None:
    """Refuse a ``value`` above ``limit``; ``shown`` names the key and value."""
    if value > limit:
        raise ConfigError(f"{shown} is above seqae's limit of {limit:,}; split the study into several sweeps "
                          "(`seqae sweep fork` starts one from another's trials)")


class _Section(BaseModel):
    """A part of a sweep file: exact types (``true`` is not 1), finite numbers, no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class Distribution(_Section):
    """What Optuna samples for one config key."""

    type: Literal["loguniform", "uniform", "int", "categorical"] = Field(
        description="how the key is sampled: loguniform and uniform between low and high, int a whole number "
                    "between them, categorical one of choices")
    low: float | None = Field(default=None, description="the smallest value (loguniform, uniform, int)")
    high: float | None = Field(default=None, description="the largest value, included (loguniform, uniform, int)")
    step: int | None = Field(default=None, gt=0, description="int only: the spacing of the values from low")
    log: bool = Field(default=False, description="int only: sample on a log scale (loguniform always is)")
    choices: tuple[Any, ...] = Field(default=(), strict=False, description="categorical only: the values, no repeats")
    when: dict[str, tuple[Any, ...]] = Field(
        default_factory=dict, strict=False,
        description="sample the key only when each of these keys (another searched key, or a grid axis) takes one "
                    "of these values; absent from the other trials (define-by-run)")

    @field_validator("when", mode="before")
    @classmethod
    def _conditions(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {key: tuple(v) if isinstance(v, list) else (v,) for key, v in value.items()}

    @model_validator(mode="after")
    def _consistent(self) -> Distribution:
        allowed = {"categorical": {"choices"}, "int": {"low", "high", "step", "log"}}.get(self.type, {"low", "high"})
        extra = sorted(self.model_fields_set - allowed - {"type", "when"})
        if extra:
            raise ValueError(f"{extra[0]!r} does not apply to type {self.type!r}")
        if self.type == "categorical":
            if not self.choices or len(set(map(repr, self.choices))) != len(self.choices):
                raise ValueError(f"choices={list(self.choices)!r} must be a non-empty list without repeats")
            return self
        if self.low is None or self.high is None:
            raise ValueError(f"type {self.type!r} needs low and high")
        if self.type == "int" and not (self.low.is_integer() and self.high.is_integer()):
            raise ValueError(f"low={self.low} and high={self.high} must be whole numbers for type 'int'")
        if self.low > self.high:
            raise ValueError(f"low={self.low} is greater than high={self.high}")
        if (self.log or self.type == "loguniform") and self.low <= 0:
            raise ValueError(f"low={self.low} must be positive on a log scale")
        if self.log and (self.step or 1) != 1:
            raise ValueError(f"step={self.step} cannot be combined with log: true")
        return self

    def active(self, params: dict[str, Any]) -> bool:
        """Whether this key is sampled in a trial whose earlier keys took ``params``."""
        return all(key in params and params[key] in values for key, values in self.when.items())

    def contains(self, value: Any) -> bool:
        if self.type == "categorical":
            return value in self.choices
        assert self.low is not None and self.high is not None
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high
                and (self.type != "int" or float(value).is_integer()))

    @model_serializer(mode="wrap")
    def _canonical(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Only what differs from the defaults (a key that does not apply to the type is refused
        when read back), an int's bounds as whole numbers."""
        out = {k: v for k, v in dump(self).items()
               if k == "type" or getattr(self, k) != type(self).model_fields[k].get_default(call_default_factory=True)}
        return out | ({"low": int(self.low or 0), "high": int(self.high or 0)} if self.type == "int" else {})


class Objective(_Section):
    metric: str = Field(description="a validation metric every training reports (test metrics are refused): "
                                    + ", ".join(M.OBJECTIVES))
    mode: Literal["min", "max"] = Field(description="max for accuracies, min for losses and sizes")
    target: float | None = Field(default=None, description="one objective only: once a trial reaches it, the sweep "
                                                           "starts no new trials (running ones finish)")

    @property
    def sign(self) -> float:
        """1 to maximize, -1 to minimize: the value times it is to be maximized."""
        return 1.0 if self.mode == "max" else -1.0

    def reached(self, value: float) -> bool:
        return self.target is not None and (value >= self.target if self.mode == "max" else value <= self.target)

    @model_validator(mode="after")
    def _reported(self) -> Objective:
        _check_selectable(self.metric)
        if self.mode not in M.OBJECTIVES[self.metric]:
            raise ValueError(f"mode={self.mode!r} for {self.metric} optimizes in the wrong direction")
        return self


def _check_selectable(metric: str) -> None:
    """A metric a choice may rest on: reported by every training, and not measured on the test pages."""
    if metric in M.TEST_METRICS:
        raise ValueError(f"metric={metric!r} is measured on the test pages, which no choice may see (not the "
                         "search, a target, a constraint or a scheduler); use a validation metric, and the test "
                         "metrics are reported beside it")
    if metric not in M.OBJECTIVES:
        raise ValueError(f"metric={metric!r} is not reported by the trainer; choose from {', '.join(M.OBJECTIVES)}")


class Constraint(_Section):
    metric: str = Field(description="a metric an objective may name (test metrics are refused)")
    at_least: float | None = Field(default=None, description="a trial meets it with the metric at least this "
                                                             "(one of at_least, at_most)")
    at_most: float | None = Field(default=None, description="a trial meets it with the metric at most this "
                                                            "(one of at_least, at_most)")

    @model_validator(mode="after")
    def _one_bound(self) -> Constraint:
        _check_selectable(self.metric)
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError(f"the constraint on {self.metric} needs exactly one of at_least or at_most")
        return self

    def violation(self, value: float) -> float:
        """How far ``value`` is outside the bound, 0 or less when inside it (Optuna's convention)."""
        if self.at_least is not None:
            return self.at_least - value
        assert self.at_most is not None  # exactly one bound (_one_bound)
        return value - self.at_most


class _Trials(_Section):
    per_cell: int | None = Field(default=None, gt=0, description="trials in each grid cell (one of per_cell, total)")
    total: int | None = Field(default=None, gt=0, description="trials in the whole sweep (one of per_cell, total)")

    @model_validator(mode="after")
    def _one(self) -> _Trials:
        if len(self.model_fields_set) != 1:
            raise ValueError("trials must have exactly one of per_cell or total")
        return self


# The sampler's settings, pinned here rather than left to the installed Optuna's defaults (which
# changed between 4.x and 5.x). TPE models the searched keys jointly (multivariate; Optuna's own
# benchmarks favour it over independent TPE), in groups of keys that occur together (group: what
# lets a multivariate TPE model a conditional space), and gives running trials a pessimistic value
# (constant_liar), so that trials started at the same time are not proposed the same point.
# n_startup_trials is Optuna's 10: a sweep that cannot leave it is told so (SweepSpec.notes).
SAMPLER_DEFAULTS: dict[str, dict[str, Any]] = {
    "tpe": {"n_startup_trials": 10, "multivariate": True, "group": True, "constant_liar": True},
    "gp": {"n_startup_trials": 10},
    "random": {},
    "nsga2": {},
}


class _Sampler(_Section):
    type: Literal["tpe", "gp", "random", "nsga2"] | None = Field(
        default=None, description="Optuna's sampler; unset: TPE, or NSGA-II for several objectives (why, and why the "
                                   "studies name random: docs/how-to/search.md, \"Which sampler\")")
    seed: int = Field(default=0, ge=0, lt=2**32, description="seeds the sampler (numpy's range: 0 .. 2**32 - 1)")
    n_startup_trials: int | None = Field(
        default=None, ge=0,
        description="TPE and GP: random proposals before the model takes over, counted over finished trials "
                    "(TPE: complete and pruned, GP: complete), starting points and a fork's trials included (10 when unset)")
    multivariate: bool | None = Field(default=None, description="TPE only: model the searched keys jointly "
                                                                 "(true when unset)")
    group: bool | None = Field(default=None, description="TPE only: model keys that occur together as a group "
                                                          "(what a conditional space needs; true when unset)")
    constant_liar: bool | None = Field(default=None, description="TPE only: give running trials a pessimistic value, "
                                                                  "so trials started together differ (true when unset)")

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if not isinstance(kind, str) or kind not in SAMPLER_DEFAULTS or set(value) - set(cls.model_fields):
            return value  # pydantic names what is wrong with it: the type, or an unknown key (a typo) first
        defaults = SAMPLER_DEFAULTS[kind]
        extra = sorted(k for k in (set(value) & set(SAMPLER_DEFAULTS["tpe"])) - set(defaults) if value[k] is not None)
        if extra:
            raise ValueError(f"{extra[0]!r} does not apply to type {value['type']!r}; leave it out (with --set, "
                             f"replace the whole sampler: sampler={{type: {value['type']}, seed: 0}})")
        return {**defaults, **{k: v for k, v in value.items() if v is not None}}

    @property
    def models(self) -> bool:
        """Whether proposals come from a model that starts after n_startup_trials."""
        return self.type in ("tpe", "gp")


class _Scheduler(_Section):
    type: Literal["none", "asha", "hyperband"] = Field(
        default="none", description="asha: stop the trials behind at each rung (with several objectives, by "
                                    "non-dominated sorting: a trial on the rung's Pareto front goes on); hyperband: "
                                    "asynchronous Hyperband, ASHA in brackets whose first rungs come later and later "
                                    "(grace_period x factor^b), each trial in one, most in the first; none: train "
                                    "every trial out")
    grace_period: int = Field(default=1, gt=0, description="ASHA: the epoch of the first rung")
    reduction_factor: int = Field(default=2, ge=2, description="ASHA: 1 in this many trials goes on past each rung; "
                                                               "rungs at grace_period x factor^k epochs")

    @property
    def label(self) -> str:
        """The scheduler's name in messages."""
        return {"asha": "ASHA", "hyperband": "Hyperband"}.get(self.type, "no scheduler")

    def rungs(self, epochs: int) -> list[int]:
        """The epochs at which ASHA (Hyperband's first bracket) decides, in trials of ``epochs``."""
        return list(itertools.takewhile(lambda rung: rung < epochs,
                                        (self.grace_period * self.reduction_factor**k for k in itertools.count())))

    def brackets(self, epochs: int) -> int:
        """Ray's brackets: one for ASHA; for Hyperband one per rung, each starting a rung later."""
        return max(1, len(self.rungs(epochs))) if self.type == "hyperband" else 1


class _Resources(_Section):
    cpu: float = Field(default=1.0, gt=0, description="CPUs Ray reserves for each trial")
    gpu: float = Field(default=0.0, ge=0, description="GPUs for each trial; a fraction packs several trials on one "
                                                       "GPU, above 1 a whole number")

    @model_validator(mode="after")
    def _whole(self) -> _Resources:
        if self.gpu > 1 and not self.gpu.is_integer():
            raise ValueError(f"gpu={self.gpu}: above 1, GPUs per trial must be a whole number")
        return self


class _Budget(_Section):
    cpu_hours: float | None = Field(default=None, gt=0, description="training wall time x CPUs per trial, summed "
                                                                     "over trials (one of cpu_hours, gpu_hours)")
    gpu_hours: float | None = Field(default=None, gt=0, description="training wall time x GPU fraction per trial, "
                                                                     "summed over trials")

    @model_validator(mode="after")
    def _one(self) -> _Budget:
        if len(self.model_fields_set) != 1:
            raise ValueError("budget must have exactly one of cpu_hours or gpu_hours")
        return self

    @property
    def unit(self) -> str:
        return "gpu" if self.gpu_hours else "cpu"

    @property
    def hours(self) -> float:
        return float(self.gpu_hours or self.cpu_hours or 0)


class _Notify(_Section):
    urls: tuple[str, ...] = Field(default=(), strict=False, description="Apprise URLs to tell; env:NAME reads one "
                                                                        "from $NAME, where tokens belong")
    events: tuple[notify.Event, ...] = Field(default=notify.EVENTS, strict=False, description="what they are told of")

    @model_validator(mode="after")
    def _understood(self) -> _Notify:
        for n, url in enumerate(self.urls):
            if url.startswith("env:") and not url[4:].isidentifier():
                raise ValueError(f"urls[{n}]: env:NAME needs an environment variable's name, not {url[4:]!r}")
            if not url.startswith("env:") and not notify.understood(url):
                # the URL itself is not repeated: it may hold a token
                raise ValueError(f"urls[{n}] is not a URL Apprise understands (https://github.com/caronc/apprise/wiki)")
        return self


class _Checkpoints(_Section):
    keep_best: int = Field(default=5, ge=1, description="how many of the best complete trials (the Pareto front's, "
                                                         "with several objectives) keep their checkpoints once ended; "
                                                         "every other ended trial keeps its progress, samples and "
                                                         "metrics, but not its model: it cannot train on "
                                                         "(`extend --epochs`)")


class _WarmStart(_Section):
    sweeps: tuple[str, ...] = Field(alias="from", min_length=1, strict=False,
                                    description="earlier sweeps of this workspace with the same objective, at "
                                                "any fixed settings (another latent fraction, another input length)")
    top: int = Field(default=5, ge=1, le=100, description="how many of each one's best complete trials (those whose "
                                                           "searched values fit this sweep's space) run first")


def _listed(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def _source(info: ValidationInfo) -> str:
    return str((info.context or {}).get("source", "the sweep file"))


DEFAULT_OBJECTIVE = Objective(metric=M.VAL_TOKEN_ACCURACY, mode="max")


class SweepSpec(_Section):
    """A sweep file, validated, with its profile and ``--set`` overrides applied: the schema of
    sweep files, stated once. Validating it (:func:`parse`) also resolves what a file leaves
    open: ``config`` becomes flat, typed config keys (the base of every trial), each grid axis a
    tuple of typed values (an axis ``"a,b"`` of pairs that vary together), and the sampler TPE, or
    NSGA-II for several objectives. ``config``, ``grid`` and ``profiles`` are checked against the
    config keys by seqae_core.config."""

    model_config = ConfigDict(populate_by_name=True)

    description: str = Field(default="", description="free text, shown by status and the report")
    base: dict[str, Any] = Field(default_factory=dict, alias="config",
                                 description="the base config of every trial: the keys of `seqae train --config`")
    grid: dict[str, tuple[Any, ...]] = Field(
        default_factory=dict, description="cartesian axes, {config key: [values]}; an axis \"key_a,key_b\" of "
                                          "[[a, b], ...] varies the keys together")
    search: dict[str, Distribution] = Field(default_factory=dict,
                                            description="what Optuna samples: {config key: distribution}")
    start: dict[str, dict[str, Any]] = Field(
        default_factory=dict, strict=False,
        description="named starting points tried first, in order: {name: {config key: value}}; each trains all its "
                    "epochs (the scheduler never stops it) and counts toward trials")
    objectives: Annotated[tuple[Objective, ...], BeforeValidator(_listed)] = Field(
        default=(DEFAULT_OBJECTIVE,), alias="objective", min_length=1, strict=False,
        description="what the search optimizes: one objective, or a list of them for a Pareto front")
    constraints: tuple[Constraint, ...] | None = Field(
        default=None, strict=False,
        description="bounds a trial must meet to count, for example [{metric: val_token_accuracy, at_least: 0.9}]: "
                    "the best trial and the Pareto front are chosen among the trials that meet them, and the "
                    "sampler (TPE, NSGA-II or GP) proposes with them in mind")
    trials: _Trials = Field(default=_Trials(per_cell=1), description="how many trials: per grid cell, or in all")
    sampler: _Sampler = Field(default=_Sampler(), description="who proposes the trials, with its settings pinned "
                                                              "here rather than left to the installed Optuna's")
    scheduler: _Scheduler = Field(default=_Scheduler(), description="who stops trials early")
    resources: _Resources = Field(default=_Resources(), description="what each trial gets from Ray")
    max_concurrent: int = Field(default=1, gt=0, description="trials running at once; `seqae sweep set` changes it "
                                                             "while the sweep runs")
    retries: int = Field(default=0, ge=0, description="times a trial whose worker was lost starts again from its "
                                                      "newest checkpoint (a diverging loss or a bad config is not "
                                                      "retried: it would fail again)")
    budget: _Budget | None = Field(default=None, description="once its trials have spent it, running trials stop at "
                                                             "their epoch's end and no new one starts")
    checkpoints: _Checkpoints = Field(default=_Checkpoints(), description="which ended trials keep their "
                                                                          "checkpoints: what running trials need is "
                                                                          "always kept")
    notify: _Notify | None = Field(default=None, description="who is told of a new best, a failure, a stop and the end")
    warm_start: _WarmStart | None = Field(
        default=None, description="transfer: the best configurations of earlier sweeps run first, as starting points "
                                  "named SWEEP.tNUMBER (this sweep's fixed settings hold for them); resolved when the "
                                  "sweep is created")
    profiles: dict[str, Any] | None = Field(
        default=None, strict=False,
        description="named blocks of overrides, {name: {description, config key: value, ...}}; `--profile NAME` "
                    "applies one before any --set")
    profile: str | None = Field(default=None, description="the profile applied, if any (set by --profile)")
    _source: str = PrivateAttr(default="")

    @property
    def source(self) -> str:
        """The file (or text) the sweep came from, for messages."""
        return self._source

    @model_validator(mode="before")
    @classmethod
    def _open_settings(cls, doc: Any) -> Any:
        """`--set scheduler.type=none` reads as null; no sampler type means TPE, or NSGA-II for
        several objectives."""
        if not isinstance(doc, dict):
            return doc
        doc = dict(doc)
        if isinstance(doc.get("scheduler"), dict) and doc["scheduler"].get("type", "none") is None:
            doc["scheduler"] = {**doc["scheduler"], "type": "none"}
        sampler = doc.get("sampler", {})
        if isinstance(sampler, dict) and sampler.get("type") is None:
            several = len(_listed(doc.get("objective", [DEFAULT_OBJECTIVE]))) > 1
            doc["sampler"] = {**sampler, "type": "nsga2" if several else "tpe"}
        return doc

    @field_validator("base", mode="before")
    @classmethod
    def _config(cls, value: Any, info: ValidationInfo) -> dict[str, Any]:
        where = f"{_source(info)}: config"
        base = {k: coerce(k, v, where) for k, v in flatten(value or {}, where).items()}
        if isinstance(base.get("data.path"), str):
            base["data.path"] = local_path(base["data.path"])
        return base

    @field_validator("grid", mode="before")
    @classmethod
    def _resolve_grid(cls, value: Any, info: ValidationInfo) -> dict[str, tuple[Any, ...]]:
        return _grid(value or {}, _source(info))

    @field_validator("search", mode="before")
    @classmethod
    def _no_search(cls, value: Any, info: ValidationInfo) -> Any:
        return value or {}

    @field_validator("search")
    @classmethod
    def _check_search(cls, value: dict[str, Distribution], info: ValidationInfo) -> dict[str, Distribution]:
        return _search(value, _source(info))

    @field_validator("start", mode="before")
    @classmethod
    def _starts(cls, value: Any, info: ValidationInfo) -> dict[str, dict[str, Any]]:
        source = _source(info)
        if not isinstance(value or {}, dict):
            raise ConfigError(f"{source}: start must map names to configurations, e.g. {{paper: {{model.block: paper}}}}")
        starts = {}
        for name, point in (value or {}).items():
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
                raise ConfigError(f"{source}: start: {name!r} is not a name (letters, digits, '_', '.', '-')")
            where = f"{source}: start.{name}"
            starts[name] = {k: coerce(k, v, where) for k, v in flatten(mapping(point or {}, f"start.{name}", source),
                                                                       where).items()}
        return starts

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> SweepSpec:
        source = _source(info)
        grid_keys = [k for axis in self.grid for k in axis.split(",")]
        if len(set(grid_keys)) != len(grid_keys):
            raise ConfigError(f"{source}: a config key appears in two grid axes: {grid_keys}")
        both = sorted(set(grid_keys) & set(self.search))
        if both:
            raise ConfigError(f"{source}: {both[0]} is in both grid and search; a key is either a grid axis or "
                              "searched")
        cells = math.prod(len(values) for values in self.grid.values())
        check_limit(f"{source}: grid with {cells:,} cells", cells, MAX_TRIALS)
        total, per_cell = self.trials.total or 0, self.trials.per_cell or 0
        check_limit(f"{source}: trials.total={total:,}", total, MAX_TRIALS)
        check_limit(f"{source}: trials.per_cell={per_cell:,} x {cells:,} grid cells = {per_cell * cells:,} trials",
                    per_cell * cells, MAX_TRIALS)
        check_limit(f"{source}: max_concurrent={self.max_concurrent:,}", self.max_concurrent, MAX_CONCURRENT)
        several = len(self.objectives)
        if len({o.metric for o in self.objectives}) != several:
            raise ConfigError(f"{source}: objective names a metric twice")
        if several > 1 and any(o.target is not None for o in self.objectives):
            raise ConfigError(f"{source}: objective.target needs one objective; this sweep has {several}")
        if self.warm_start is not None and several > 1:
            raise ConfigError(f"{source}: warm_start needs one objective (its sweeps' best trials); this sweep has "
                              f"{several}")
        if self.constraints and self.sampler.type == "random":
            raise ConfigError(f"{source}: constraints need a sampler that models them (tpe, nsga2 or gp); "
                              "sampler.type='random' proposes without them")
        _check_conditions(self, source)
        _check_starts(self, source)
        _check_sampler(self, source)
        if self.budget is not None and self.budget.unit != self.share[0]:
            raise ConfigError(f"{source}: budget.{self.budget.unit}_hours, but trials are counted in "
                              f"{self.share[0]}-hours here (resources.gpu={self.resources.gpu}); use "
                              f"budget.{self.share[0]}_hours")
        return self

    @property
    def share(self) -> tuple[str, float]:
        """What one trial holds, as its cost counts it: ("gpu", its GPU fraction) or ("cpu", its CPUs)."""
        return ("gpu", self.resources.gpu) if self.resources.gpu else ("cpu", self.resources.cpu)

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    def violations(self, record: dict[str, Any]) -> list[float]:
        """How far an epoch's ``record`` is outside each constraint (0 or less: inside it)."""
        return [c.violation(float(record[c.metric])) for c in self.constraints or ()]

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

    def sampling_order(self) -> list[str]:
        """The searched keys in the order a trial samples them: each after the keys its condition
        names (else as the file lists them)."""
        return _sampling_order(self.search, set(self.grid_keys()), self.source)

    def start_params(self, name: str) -> dict[str, Any]:
        """Starting point ``name``'s value of each searched key it samples: its own, else the base
        config's (a starting point is a whole configuration)."""
        values = build(trial_layers(self.source, self.base, self.start[name])).flat()
        params: dict[str, Any] = {}
        for key in self.sampling_order():
            if self.search[key].active(params):
                params[key] = values[key]
        return params

    def notes(self) -> list[str]:
        """What a user should know before this sweep runs, though it is valid."""
        notes = []
        if any(not config.data.test_fraction for config in cell_configs(self)):
            notes.append("no test split (data.test_fraction is 0): every number is measured on the validation pages "
                         "the search selects on, and is biased upward by that selection")
        sampled = self.planned_trials() - len(self.start)
        if self.search and self.sampler.models and sampled > 0:
            startup = self.sampler.n_startup_trials or 0
            if self.planned_trials() <= startup:
                notes.append(f"{self.planned_trials()} trials, {startup} random start-up trials (sampler.n_startup_trials): "
                             f"this is a random search, {str(self.sampler.type).upper()} proposes no trial; lower "
                             "sampler.n_startup_trials or raise trials.total")
        if self.scheduler.type != "none":
            grace, factor = self.scheduler.grace_period, self.scheduler.reduction_factor
            epochs = max(config.train.epochs for config in cell_configs(self))
            rungs = self.scheduler.rungs(epochs)
            if len(rungs) < 2:
                notes.append(f"{self.scheduler.label} decides {f'once, at epoch {rungs[0]}' if rungs else 'never'} of "
                             f"{epochs} "
                             f"(scheduler.grace_period {grace}, reduction_factor {factor}): a trial is stopped at most "
                             f"once; train.epochs above {grace * factor} gives it a second rung")
        return notes

    def planned_trials(self) -> int:
        if self.trials.total is not None:
            return self.trials.total
        return (self.trials.per_cell or 1) * len(self.cells())

    def to_dict(self) -> dict[str, Any]:
        """The canonical form stored with a sweep: every field, as JSON, so that it reloads to the
        same spec (no field can be left out of it) and is diffed on resume."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


SWEEP_KEYS = [f.alias or name for name, f in SweepSpec.model_fields.items()]


def load(path: str | Path, sets: list[str] | tuple[str, ...] = ()) -> SweepSpec:
    """Read, override and validate a sweep file."""
    source = str(path)
    return parse(apply_sets(read_document(path, SWEEP_KEYS), sets, source, SWEEP_KEYS), source)


def local_path(value: str) -> str:
    """A relative ``data.path`` naming something here, made absolute: trials run in Ray's own
    working directory or on another node, where the user's relative path means nothing. A name
    that is not a local path (a Hub dataset such as ``wikimedia/wikipedia``) stays as it is."""
    try:
        path = Path(value).expanduser()
        return str(path.resolve()) if not path.is_absolute() and path.exists() else value
    except (OSError, RuntimeError):  # a name too long for a path, or ~name of no user: not a local path
        return value


def validate(doc: dict[str, Any], source: str) -> SweepSpec:
    """A sweep document checked against the schema alone: what a sweep's record holds
    (:meth:`SweepSpec.to_dict`), whose profiles and cross-field checks :func:`parse` applied when
    the sweep was created."""
    try:
        spec = SweepSpec.model_validate(doc, context={"source": source})
    except ValidationError as exc:
        raise ConfigError(reason(exc, source)) from None
    spec._source = source
    return spec


def parse(doc: dict[str, Any], source: str) -> SweepSpec:
    """Validate a sweep document (the mapping in a file, or :meth:`SweepSpec.to_dict`)."""
    spec = validate(doc, source)
    if spec.profiles is not None:  # every profile must give a valid sweep, whichever is run
        for name in spec.profiles:
            try:
                parse(apply_profile(copy.deepcopy(doc), name, source, SWEEP_KEYS), source)
            except ConfigError as exc:
                raise ConfigError(f"{exc} (with profile {name!r})") from None
        spec = spec.model_copy(update={"profiles": None})  # the sweep is what they were applied to (its source kept)
    check_trial_configs(spec)
    return spec


def trial_layers(source: str, base: dict[str, Any], params: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The config layers of one trial: the base config under its grid cell's and searched values."""
    return [(f"{source}: config", base), (f"{source}: trial parameters", params)]


def check_trial_configs(spec: SweepSpec) -> None:
    """Every grid cell must give a valid config, alone and with each searched value (each
    categorical choice, each numeric bound) set on it. Combinations of several searched values
    are not tried: a trial whose combination is invalid fails on its own, and the sweep goes on."""
    probes: list[dict[str, Any]] = [{}, *(dict(point) for point in spec.start.values())]
    for key, dist in spec.search.items():
        values = dist.choices or (dist.low, dist.high)
        condition = {k: v[0] for k, v in dist.when.items()}  # a value under which the key is sampled
        probes += [{**condition, key: v} for v in values]
    for cell in spec.cells():
        for probe in probes:
            where = " and ".join(f"{k}={v!r}" for k, v in {**cell, **probe}.items()) or "the base config"
            try:
                config = build(trial_layers(spec.source, spec.base, {**cell, **probe}))
            except ConfigError as exc:
                raise ConfigError(f"{exc} (with {where})") from None
            if config.train.head == "fused" and not spec.resources.gpu:  # else every trial would fail alone
                raise ConfigError(f"{spec.source}: train.head=fused runs on CUDA only, and the trials get no GPU "
                                  f"(resources.gpu=0; with {where}): set resources.gpu or train.head=auto")


def _grid(grid: Any, source: str) -> dict[str, tuple[Any, ...]]:
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
                    raise ConfigError(f"{source}: grid.{axis}: {value!r} must be a list of {len(keys)} values, "
                                      f"one for each of {', '.join(keys)}")
                rows.append(tuple(coerce(k, v, f"{source}: grid.{axis}") for k, v in zip(keys, value)))
            coerced = tuple(rows)
        if len(set(map(repr, coerced))) != len(coerced):
            raise ConfigError(f"{source}: grid.{axis}={values!r} repeats a value")
        axes[axis] = coerced
    return axes


def _search(search: dict[str, Distribution], source: str) -> dict[str, Distribution]:
    """The distributions, checked against the types of the keys they sample."""
    for key, dist in search.items():
        where = f"{source}: search.{key}"
        if key not in KEYS:
            raise ConfigError(f"{source}: search: unknown config key {key!r}")
        if key == "train.repeats":
            raise ConfigError(f"{where}: the number of seeds is how a trial is measured, not a hyperparameter to "
                              "search; set it in config (train.repeats: 3) for every trial")
        if dist.type in ("uniform", "loguniform") and not accepts_float(key):
            raise ConfigError(f"{where}.type={dist.type!r} samples fractions, but {key} is an integer; use type: int")
        for value in dist.choices or (dist.low, dist.high):
            coerce(key, value, where)
    return search


def _check_conditions(spec: SweepSpec, source: str) -> None:
    """A condition names a grid axis or another searched key, and values that key can take; the
    conditions form no cycle (``sampling_order``)."""
    grid = spec.grid_keys()
    for key, dist in spec.search.items():
        for other, values in dist.when.items():
            where = f"{source}: search.{key}.when.{other}"
            if not values:
                raise ConfigError(f"{where}: lists no value, so {key} would never be sampled")
            if other in grid:
                impossible = [v for v in values if v not in grid[other]]
            elif other in spec.search and other != key:
                impossible = [v for v in values if not spec.search[other].contains(v)]
            else:
                raise ConfigError(f"{where}: {other} is not a grid axis or another searched key; a condition can "
                                  "only name one")
            if impossible:
                raise ConfigError(f"{where}: {other}={impossible[0]!r} is a value {other} never takes")
    _sampling_order(spec.search, set(grid), source)


def _sampling_order(search: dict[str, Distribution], grid: set[str], source: str) -> list[str]:
    order: list[str] = []
    placed = set(grid)
    pending = list(search)
    while pending:
        ready = [key for key in pending if set(search[key].when) <= placed]
        if not ready:
            raise ConfigError(f"{source}: the conditions of search.{', search.'.join(pending)} name each other in a "
                              "cycle; one of them must be sampled unconditionally")
        order += ready
        placed.update(ready)
        pending = [key for key in pending if key not in placed]
    return order


def _check_starts(spec: SweepSpec, source: str) -> None:
    """Starting points (and a warm start's) go with a search, fit in the trial budget, and each is a
    valid config whose searched values lie in the searched space."""
    if spec.warm_start is not None and not spec.search:
        raise ConfigError(f"{source}: warm_start: the earlier sweeps' configurations need a search to start")
    if not spec.start:
        return
    if spec.grid:
        raise ConfigError(f"{source}: start: a grid lists its configurations already; starting points go with "
                          "search")
    if not spec.search:
        raise ConfigError(f"{source}: start: starting points need a search to start")
    if len(spec.start) > spec.planned_trials():
        raise ConfigError(f"{source}: start: {len(spec.start)} starting points, but the sweep plans "
                          f"{spec.planned_trials()} trials; raise trials.total")
    for name, point in spec.start.items():
        where = f"{source}: start.{name}"
        try:
            params = spec.start_params(name)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (in {where})") from None
        for key, value in params.items():
            if not spec.search[key].contains(value):
                set_here = "its value" if key in point else "the base config's value (the point does not set it)"
                raise ConfigError(f"{where}: {key}={value!r} ({set_here}) is outside search.{key}; a starting "
                                  "point lies in the searched space")


def _check_sampler(spec: SweepSpec, source: str) -> None:
    if spec.sampler.type != "gp":
        return
    categorical = next((k for k, d in spec.search.items() if d.type == "categorical"), None) or next(iter(spec.grid), None)
    if categorical or any(d.when for d in spec.search.values()):
        why = f"{categorical} is categorical" if categorical else "it has conditions"
        raise ConfigError(f"{source}: sampler.type='gp' models numeric spaces only; this one is not ({why}); use "
                          "type: tpe")


def diff(stored: SweepSpec, current: SweepSpec) -> str:
    """A unified diff of two specs' canonical YAML; empty when they run the same sweep."""
    a = yaml.safe_dump(stored.to_dict(), sort_keys=True).splitlines()
    b = yaml.safe_dump(current.to_dict(), sort_keys=True).splitlines()
    return "\n".join(difflib.unified_diff(a, b, "stored sweep", current.source, lineterm=""))


def cell_configs(spec: SweepSpec) -> list[Config]:
    """The config of every grid cell (searched keys at their base values)."""
    return [build(trial_layers(spec.source, spec.base, cell)) for cell in spec.cells()]
