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
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from seqae_core.borders import Document
from seqae_core.config import FREE_KEYS, Config, Flat, FlatValue, Layer, build, coerce, flatten
from seqae_core.epoch import score
from seqae_errors import ConfigError
from sweeps.spec.messages import reason
from sweeps.spec.overrides import apply_profile, apply_sets, mapping, read_document
from sweeps.spec.sections import (
    DEFAULT_OBJECTIVE,
    MAX_CONCURRENT,
    MAX_TRIALS,
    BudgetSection,
    CheckpointsSection,
    Constraint,
    Distribution,
    NotifySection,
    Objective,
    ResourcesSection,
    SamplerSection,
    SchedulerSection,
    Section,
    TrialsSection,
    WarmStartSection,
    check_limit,
    listed,
    source_of,
)
from sweeps.spec.space import check_conditions, checked_search, grid_axes, sampling_order


class SweepSpec(Section):
    """A sweep file, validated, with its profile and ``--set`` overrides applied: the schema of
    sweep files, stated once. Validating it (:func:`parse`) also resolves what a file leaves
    open: ``config`` becomes flat, typed config keys (the base of every trial), each grid axis a
    tuple of typed values (an axis ``"a,b"`` of pairs that vary together), and the sampler TPE, or
    NSGA-II for several objectives. ``config``, ``grid`` and ``profiles`` are checked against the
    config keys by seqae_core.config."""

    model_config = ConfigDict(populate_by_name=True)

    description: str = Field(default="", description="free text, shown by status and the report")
    base: dict[str, Any] = Field(
        default_factory=dict,
        alias="config",
        description="the base config of every trial: the keys of `seqae train --config`",
    )
    grid: dict[str, tuple[Any, ...]] = Field(
        default_factory=dict,
        description='cartesian axes, {config key: [values]}; an axis "key_a,key_b" of '
        "[[a, b], ...] varies the keys together",
    )
    search: dict[str, Distribution] = Field(
        default_factory=dict, description="what Optuna samples: {config key: distribution}"
    )
    start: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        strict=False,
        description="named starting points tried first, in order: {name: {config key: value}}; each trains all its "
        "epochs (the scheduler never stops it) and counts toward trials",
    )
    objectives: Annotated[tuple[Objective, ...], BeforeValidator(listed)] = Field(
        default=(DEFAULT_OBJECTIVE,),
        alias="objective",
        min_length=1,
        strict=False,
        description="what the search optimizes: one objective, or a list of them for a Pareto front",
    )
    constraints: tuple[Constraint, ...] | None = Field(
        default=None,
        strict=False,
        description="bounds a trial must meet to count, for example [{metric: val_token_accuracy, at_least: 0.9}]: "
        "the best trial and the Pareto front are chosen among the trials that meet them, and the "
        "sampler (TPE, NSGA-II or GP) proposes with them in mind",
    )
    trials: TrialsSection = Field(
        default=TrialsSection(per_cell=1), description="how many trials: per grid cell, or in all"
    )
    sampler: SamplerSection = Field(
        default=SamplerSection(),
        description="who proposes the trials, with its settings pinned here rather than left to the installed Optuna's",
    )
    scheduler: SchedulerSection = Field(default=SchedulerSection(), description="who stops trials early")
    resources: ResourcesSection = Field(default=ResourcesSection(), description="what each trial gets from Ray")
    max_concurrent: int = Field(
        default=1, gt=0, description="trials running at once; `seqae sweep set` changes it while the sweep runs"
    )
    priority: int | None = Field(
        default=None,
        description="the sweep's priority for the cluster's trial slots (default 0): a higher one's "
        "trials are placed first, and take slots from lower ones at their next "
        "validation; `seqae sweep priority` changes it while the sweep runs",
    )
    weight: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="the sweep's weight among sweeps of its priority (default 1): their slots are divided in "
        "proportion to their weights, so a sweep of weight 3 holds three times the slots of one of "
        "weight 1 while both have trials to run",
    )
    retries: int = Field(
        default=0,
        ge=0,
        description="times a trial whose worker was lost starts again from its "
        "newest checkpoint (a diverging loss or a bad config is not "
        "retried: it would fail again)",
    )
    budget: BudgetSection | None = Field(
        default=None,
        description="once its trials have spent it, running trials stop at their epoch's end and no new one starts",
    )
    checkpoints: CheckpointsSection = Field(
        default=CheckpointsSection(),
        description="which ended trials keep their checkpoints: what running trials need is always kept",
    )
    notify: NotifySection | None = Field(
        default=None, description="who is told of a new best, a failure, a stop and the end"
    )
    warm_start: WarmStartSection | None = Field(
        default=None,
        description="transfer: the best configurations of earlier sweeps run first, as starting points "
        "named SWEEP.tNUMBER (this sweep's fixed settings hold for them); resolved when the "
        "sweep is created",
    )
    profiles: dict[str, Any] | None = Field(
        default=None,
        strict=False,
        description="named blocks of overrides, {name: {description, config key: value, ...}}; `--profile NAME` "
        "applies one before any --set",
    )
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
            several = len(listed(doc.get("objective", [DEFAULT_OBJECTIVE]))) > 1
            doc["sampler"] = {**sampler, "type": "nsga2" if several else "tpe"}
        return doc

    @field_validator("base", mode="before")
    @classmethod
    def _config(cls, value: Any, info: ValidationInfo) -> Flat:
        where = f"{source_of(info)}: config"
        base = {k: coerce(k, v, where) for k, v in flatten(value or {}, where).items()}
        if isinstance(base.get("data.path"), str):
            base["data.path"] = local_path(base["data.path"])
        return base

    @field_validator("grid", mode="before")
    @classmethod
    def _resolve_grid(cls, value: Any, info: ValidationInfo) -> dict[str, tuple[Any, ...]]:
        return grid_axes(value or {}, source_of(info))

    @field_validator("search", mode="before")
    @classmethod
    def _no_search(cls, value: Any, info: ValidationInfo) -> Any:
        return value or {}

    @field_validator("search")
    @classmethod
    def _check_search(cls, value: dict[str, Distribution], info: ValidationInfo) -> dict[str, Distribution]:
        return checked_search(value, source_of(info))

    @field_validator("start", mode="before")
    @classmethod
    def _starts(cls, value: Any, info: ValidationInfo) -> dict[str, Flat]:
        source = source_of(info)
        if not isinstance(value or {}, dict):
            raise ConfigError(
                f"{source}: start must map names to configurations, e.g. {{paper: {{model.block: paper}}}}"
            )
        starts = {}
        for name, point in (value or {}).items():
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
                raise ConfigError(f"{source}: start: {name!r} is not a name (letters, digits, '_', '.', '-')")
            where = f"{source}: start.{name}"
            starts[name] = {
                k: coerce(k, v, where) for k, v in flatten(mapping(point or {}, f"start.{name}", source), where).items()
            }
        return starts

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> SweepSpec:
        source = source_of(info)
        grid_keys = [k for axis in self.grid for k in axis.split(",")]
        if len(set(grid_keys)) != len(grid_keys):
            raise ConfigError(f"{source}: a config key appears in two grid axes: {grid_keys}")
        both = sorted(set(grid_keys) & set(self.search))
        if both:
            raise ConfigError(
                f"{source}: {both[0]} is in both grid and search; a key is either a grid axis or searched"
            )
        cells = math.prod(len(values) for values in self.grid.values())
        check_limit(f"{source}: grid with {cells:,} cells", cells, MAX_TRIALS)
        total, per_cell = self.trials.total or 0, self.trials.per_cell or 0
        check_limit(f"{source}: trials.total={total:,}", total, MAX_TRIALS)
        check_limit(
            f"{source}: trials.per_cell={per_cell:,} x {cells:,} grid cells = {per_cell * cells:,} trials",
            per_cell * cells,
            MAX_TRIALS,
        )
        check_limit(f"{source}: max_concurrent={self.max_concurrent:,}", self.max_concurrent, MAX_CONCURRENT)
        several = len(self.objectives)
        if len({o.metric for o in self.objectives}) != several:
            raise ConfigError(f"{source}: objective names a metric twice")
        if several > 1 and any(o.target is not None for o in self.objectives):
            raise ConfigError(f"{source}: objective.target needs one objective; this sweep has {several}")
        if self.warm_start is not None and several > 1:
            raise ConfigError(
                f"{source}: warm_start needs one objective (its sweeps' best trials); this sweep has {several}"
            )
        if self.scheduler.type == "race" and several > 1:
            raise ConfigError(
                f"{source}: scheduler.type='race' races one objective's best; this sweep has {several} "
                "(use type: asha, which ranks a rung by non-dominated sorting)"
            )
        if self.constraints and self.sampler.type == "random":
            raise ConfigError(
                f"{source}: constraints need a sampler that models them (tpe, nsga2 or gp); "
                "sampler.type='random' proposes without them"
            )
        check_conditions(self.search, self.grid_keys(), source)
        _check_starts(self, source)
        _check_sampler(self, source)
        _check_fuse(self, source)
        if self.budget is not None and self.budget.unit != self.share[0]:
            raise ConfigError(
                f"{source}: budget.{self.budget.unit}_hours, but trials are counted in "
                f"{self.share[0]}-hours here (resources.gpu={self.resources.gpu}); use "
                f"budget.{self.share[0]}_hours"
            )
        return self

    @property
    def share(self) -> tuple[str, float]:
        """What one trial holds, as its cost counts it: ("gpu", its GPU fraction) or ("cpu", its CPUs)."""
        return ("gpu", self.resources.gpu) if self.resources.gpu else ("cpu", self.resources.cpu)

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    def violations(self, record: Mapping[str, object]) -> list[float]:
        """How far an epoch's ``record`` (:meth:`~seqae_core.epoch.EpochRecord.as_dict`) is outside
        each constraint (0 or less: inside it)."""
        return [c.violation(score(record, c.metric)) for c in self.constraints or ()]

    def cells(self) -> list[Flat]:
        """The grid's cells in a fixed order (one empty cell without a grid). An axis named
        ``"a,b"`` is zipped: its values are pairs that vary together."""
        cells = []
        for combination in itertools.product(*self.grid.values()):
            cell: Flat = {}
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
        return sampling_order(self.search, set(self.grid_keys()), self.source)

    def values_of(self, recorded: Mapping[str, FlatValue]) -> Flat:
        """A trial's config values from the parameters its Optuna study recorded (an ordered
        choice's position there: :meth:`~sweeps.spec.sections.Distribution.value_of`)."""
        return {k: self.search[k].value_of(v) if k in self.search else v for k, v in recorded.items()}

    def recorded(self, params: Mapping[str, FlatValue]) -> Flat:
        """What an Optuna study records of a trial's config values ``params`` (:meth:`values_of`'s inverse)."""
        return {k: self.search[k].recorded(v) if k in self.search else v for k, v in params.items()}

    def start_params(self, name: str) -> Flat:
        """Starting point ``name``'s value of each searched key it samples: its own, else the base
        config's (a starting point is a whole configuration)."""
        values = build(trial_layers(self.source, self.base, self.start[name])).flat()
        params: Flat = {}
        for key in self.sampling_order():
            if self.search[key].active(params):
                params[key] = values[key]
        return params

    def notes(self) -> list[str]:
        """What a user should know before this sweep runs, though it is valid."""
        notes = []
        if any(not config.data.test_fraction for config in cell_configs(self)):
            notes.append(
                "no test split (data.test_fraction is 0): every number is measured on the validation pages "
                "the search selects on, and is biased upward by that selection"
            )
        sampled = self.planned_trials() - len(self.start)
        if self.search and self.sampler.models and sampled > 0:
            startup = self.sampler.n_startup_trials or 0
            if self.planned_trials() <= startup:
                notes.append(
                    f"{self.planned_trials()} trials, {startup} random start-up trials (sampler.n_startup_trials): "
                    f"this is a random search, {str(self.sampler.type).upper()} proposes no trial; lower "
                    "sampler.n_startup_trials or raise trials.total"
                )
        if self.scheduler.type != "none":
            grace, factor = self.scheduler.grace_period, self.scheduler.reduction_factor
            epochs = max(config.train.epochs for config in cell_configs(self))
            rungs = self.scheduler.rungs(epochs)
            if len(rungs) < 2:
                notes.append(
                    f"{self.scheduler.label} decides {f'once, at epoch {rungs[0]}' if rungs else 'never'} of "
                    f"{epochs} "
                    f"(scheduler.grace_period {grace}, reduction_factor {factor}): a trial is stopped at most "
                    f"once; train.epochs above {grace * factor} gives it a second rung"
                )
            below = [rung for rung in rungs if rung < 1]
            if below and any(config.train.validate_every is None for config in cell_configs(self)):
                # Ray records a result at the highest rung it reached: validated once an epoch, a
                # trial's first result (epoch 1) passes the rungs below it unrecorded
                notes.append(
                    f"{self.scheduler.label}'s rungs at {', '.join(map(str, below))} epochs decide nothing "
                    "for trials that validate once an epoch: set train.validate_every to validate at "
                    f"least every {min(below)} epoch"
                )
        return notes

    def planned_trials(self) -> int:
        if self.trials.total is not None:
            return self.trials.total
        return (self.trials.per_cell or 1) * len(self.cells())

    def to_dict(self) -> Document:
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


def validate(doc: Mapping[str, object], source: str) -> SweepSpec:
    """A sweep document checked against the schema alone: what a sweep's record holds
    (:meth:`SweepSpec.to_dict`), whose profiles and cross-field checks :func:`parse` applied when
    the sweep was created."""
    try:
        spec = SweepSpec.model_validate(doc, context={"source": source})
    except ValidationError as exc:
        raise ConfigError(reason(exc, source)) from None
    spec._source = source
    return spec


def parse(doc: Mapping[str, object], source: str) -> SweepSpec:
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


def trial_layers(source: str, base: Layer, params: Layer) -> list[tuple[str, Layer]]:
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
                raise ConfigError(
                    f"{spec.source}: train.head=fused runs on CUDA only, and the trials get no GPU "
                    f"(resources.gpu=0; with {where}): set resources.gpu or train.head=auto"
                )
            if spec.resources.fuse > 1 and (config.train.repeats > 1 or config.train.compile == "on"):
                key, value = (
                    ("train.repeats", config.train.repeats) if config.train.repeats > 1 else ("train.compile", "on")
                )
                raise ConfigError(
                    f"{spec.source}: resources.fuse={spec.resources.fuse} trains each trial as one member "
                    f"of a pack, which {key}={value!r} cannot be (with {where}): set resources.fuse=1"
                )


def _check_starts(spec: SweepSpec, source: str) -> None:
    """Starting points (and a warm start's) go with a search, fit in the trial budget, and each is a
    valid config whose searched values lie in the searched space."""
    if spec.warm_start is not None and not spec.search:
        raise ConfigError(f"{source}: warm_start: the earlier sweeps' configurations need a search to start")
    if not spec.start:
        return
    if spec.grid:
        raise ConfigError(f"{source}: start: a grid lists its configurations already; starting points go with search")
    if not spec.search:
        raise ConfigError(f"{source}: start: starting points need a search to start")
    if len(spec.start) > spec.planned_trials():
        raise ConfigError(
            f"{source}: start: {len(spec.start)} starting points, but the sweep plans "
            f"{spec.planned_trials()} trials; raise trials.total"
        )
    for name, point in spec.start.items():
        where = f"{source}: start.{name}"
        try:
            params = spec.start_params(name)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (in {where})") from None
        for key, value in params.items():
            if not spec.search[key].contains(value):
                set_here = "its value" if key in point else "the base config's value (the point does not set it)"
                raise ConfigError(
                    f"{where}: {key}={value!r} ({set_here}) is outside search.{key}; a starting "
                    "point lies in the searched space"
                )


def _check_fuse(spec: SweepSpec, source: str) -> None:
    """A pack's members differ only in :data:`~seqae_core.config.FREE_KEYS`: a sweep that fuses
    must search or grid one of them, or every pack would be one trial."""
    fuse = spec.resources.fuse
    if fuse > 1 and not any(k in FREE_KEYS for k in (*spec.search, *spec.grid_keys())):
        raise ConfigError(
            f"{source}: resources.fuse={fuse} packs trials that differ only in {', '.join(FREE_KEYS)}; "
            "this sweep searches none of them, so every pack would hold one trial: search one, or set "
            "resources.fuse=1"
        )


def _check_sampler(spec: SweepSpec, source: str) -> None:
    if spec.sampler.type != "gp":
        return
    categorical = next((k for k, d in spec.search.items() if d.type == "categorical"), None) or next(
        iter(spec.grid), None
    )
    if categorical or any(d.when for d in spec.search.values()):
        why = f"{categorical} is categorical" if categorical else "it has conditions"
        raise ConfigError(
            f"{source}: sampler.type='gp' models numeric spaces only; this one is not ({why}); use type: tpe"
        )


def diff(stored: SweepSpec, current: SweepSpec) -> str:
    """A unified diff of two specs' canonical YAML; empty when they run the same sweep."""
    a = yaml.safe_dump(stored.to_dict(), sort_keys=True).splitlines()
    b = yaml.safe_dump(current.to_dict(), sort_keys=True).splitlines()
    return "\n".join(difflib.unified_diff(a, b, "stored sweep", current.source, lineterm=""))


def cell_configs(spec: SweepSpec) -> list[Config]:
    """The config of every grid cell (searched keys at their base values)."""
    return [build(trial_layers(spec.source, spec.base, cell)) for cell in spec.cells()]
