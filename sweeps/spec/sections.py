"""The sweep file's sections, each a pydantic model whose field descriptions are the reference
(docs/reference/sweep-schema.md): an objective, a constraint, a distribution to search, the
trials, sampler, scheduler, resources, budget, notifications, checkpoints and warm start; and the
limits every sweep is held to."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from seqae_core import metrics as M
from seqae_errors import ConfigError

# A typo such as `trials.total: 100000000` must not start a sweep that cannot end: Optuna's samplers
# read the whole history at every ask, and the report and the MLflow UI list every trial.
MAX_TRIALS = 10_000
MAX_CONCURRENT = 1_000  # trials running at once: far more than one cluster's GPUs
# What a sweep tells people of (sweeps/running/notify.py sends it)
Event = Literal["best", "failed", "stopped", "end"]
EVENTS: tuple[Event, ...] = ("best", "failed", "stopped", "end")


def check_limit(shown: str, value: int, limit: int) -> None:
    """Refuse a ``value`` above ``limit``; ``shown`` names the key and value."""
    if value > limit:
        raise ConfigError(
            f"{shown} is above seqae's limit of {limit:,}; split the study into several sweeps "
            "(`seqae sweep fork` starts one from another's trials)"
        )


class Section(BaseModel):
    """A part of a sweep file: exact types (``true`` is not 1), finite numbers, no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class Distribution(Section):
    """What Optuna samples for one config key."""

    type: Literal["loguniform", "uniform", "int", "categorical", "ordered"] = Field(
        description="how the key is sampled: loguniform and uniform between low and high, int a whole number "
        "between them, categorical one of choices, unordered (a sampler learns nothing about 64 from 32 "
        "and 128), ordered one of choices in the order listed (the sampler sees the position, 0, 1, 2, "
        "..., so what it learns of 256 spreads to 128 and 512 beside it; Optuna's study records the "
        "position, the trials' configs and MLflow the value): declare ordered values such as widths "
        "as int with step, or as ordered choices (128, 256, 512), and a learning rate as loguniform"
    )
    low: float | None = Field(default=None, description="the smallest value (loguniform, uniform, int)")
    high: float | None = Field(default=None, description="the largest value, included (loguniform, uniform, int)")
    step: int | None = Field(default=None, gt=0, description="int only: the spacing of the values from low")
    log: bool = Field(default=False, description="int only: sample on a log scale (loguniform always is)")
    choices: tuple[Any, ...] = Field(
        default=(),
        strict=False,
        description="categorical and ordered: the values, no repeats; ordered numbers "
        "in increasing order (spaced as the sampler should see them: "
        "evenly on the scale that matters, such as doublings)",
    )
    when: dict[str, tuple[Any, ...]] = Field(
        default_factory=dict,
        strict=False,
        description="sample the key only when each of these keys (another searched key, or a grid axis) takes one "
        "of these values; absent from the other trials (define-by-run)",
    )

    @field_validator("when", mode="before")
    @classmethod
    def _conditions(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {key: tuple(v) if isinstance(v, list) else (v,) for key, v in value.items()}

    @model_validator(mode="after")
    def _consistent(self) -> Distribution:
        allowed = {"categorical": {"choices"}, "ordered": {"choices"}, "int": {"low", "high", "step", "log"}}.get(
            self.type, {"low", "high"}
        )
        extra = sorted(self.model_fields_set - allowed - {"type", "when"})
        if extra:
            raise ValueError(f"{extra[0]!r} does not apply to type {self.type!r}")
        if self.type in ("categorical", "ordered"):
            if not self.choices or len(set(map(repr, self.choices))) != len(self.choices):
                raise ValueError(f"choices={list(self.choices)!r} must be a non-empty list without repeats")
            numbers = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in self.choices)
            if self.type == "ordered" and numbers and list(self.choices) != sorted(self.choices):
                raise ValueError(
                    f"choices={list(self.choices)!r} must be in increasing order for type 'ordered' "
                    "(the sampler reads their order)"
                )
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

    def active(self, params: Mapping[str, object]) -> bool:
        """Whether this key is sampled in a trial whose earlier keys took ``params``."""
        return all(key in params and params[key] in values for key, values in self.when.items())

    def contains(self, value: Any) -> bool:
        if self.type in ("categorical", "ordered"):
            return value in self.choices
        assert self.low is not None and self.high is not None
        return (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and self.low <= value <= self.high
            and (self.type != "int" or float(value).is_integer())
        )

    def value_of(self, recorded: Any) -> Any:
        """The config value of what an Optuna study recorded for this key: an ordered choice's
        position there (:func:`sweeps.stores.proposals.optuna_distribution`), any other key's value."""
        return self.choices[recorded] if self.type == "ordered" else recorded

    def recorded(self, value: Any) -> Any:
        """What an Optuna study records for the config value ``value`` (:meth:`value_of`'s inverse)."""
        return self.choices.index(value) if self.type == "ordered" else value

    @model_serializer(mode="wrap")
    def _canonical(self, dump: SerializerFunctionWrapHandler) -> dict[str, object]:
        """Only what differs from the defaults (a key that does not apply to the type is refused
        when read back), an int's bounds as whole numbers."""
        out = {
            k: v
            for k, v in dump(self).items()
            if k == "type" or getattr(self, k) != type(self).model_fields[k].get_default(call_default_factory=True)
        }
        return out | ({"low": int(self.low or 0), "high": int(self.high or 0)} if self.type == "int" else {})


class Objective(Section):
    metric: str = Field(
        description="a validation metric every training reports (test metrics are refused): " + ", ".join(M.OBJECTIVES)
    )
    mode: Literal["min", "max"] = Field(description="max for accuracies, min for losses and sizes")
    target: float | None = Field(
        default=None,
        description="one objective only: once a trial reaches it, the sweep starts no new trials (running ones finish)",
    )

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
        raise ValueError(
            f"metric={metric!r} is measured on the test pages, which no choice may see (not the "
            "search, a target, a constraint or a scheduler); use a validation metric, and the test "
            "metrics are reported beside it"
        )
    if metric not in M.OBJECTIVES:
        raise ValueError(f"metric={metric!r} is not reported by the trainer; choose from {', '.join(M.OBJECTIVES)}")


class Constraint(Section):
    metric: str = Field(description="a metric an objective may name (test metrics are refused)")
    at_least: float | None = Field(
        default=None, description="a trial meets it with the metric at least this (one of at_least, at_most)"
    )
    at_most: float | None = Field(
        default=None, description="a trial meets it with the metric at most this (one of at_least, at_most)"
    )

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


class TrialsSection(Section):
    per_cell: int | None = Field(default=None, gt=0, description="trials in each grid cell (one of per_cell, total)")
    total: int | None = Field(default=None, gt=0, description="trials in the whole sweep (one of per_cell, total)")

    @model_validator(mode="after")
    def _one(self) -> TrialsSection:
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


class SamplerSection(Section):
    type: Literal["tpe", "gp", "random", "nsga2"] | None = Field(
        default=None,
        description="Optuna's sampler; unset: TPE, or NSGA-II for several objectives (why, and why the "
        'studies name random: docs/how-to/search.md, "Which sampler")',
    )
    seed: int = Field(default=0, ge=0, lt=2**32, description="seeds the sampler (numpy's range: 0 .. 2**32 - 1)")
    n_startup_trials: int | None = Field(
        default=None,
        ge=0,
        description="TPE and GP: random proposals before the model takes over, counted over finished trials "
        "(TPE: complete and pruned, GP: complete), starting points and a fork's trials included (10 when unset)",
    )
    multivariate: bool | None = Field(
        default=None, description="TPE only: model the searched keys jointly (true when unset)"
    )
    group: bool | None = Field(
        default=None,
        description="TPE only: model keys that occur together as a group "
        "(what a conditional space needs; true when unset)",
    )
    constant_liar: bool | None = Field(
        default=None,
        description="TPE only: give running trials a pessimistic value, "
        "so trials started together differ (true when unset)",
    )

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if not isinstance(kind, str) or kind not in SAMPLER_DEFAULTS or set(value) - set(cls.model_fields):
            return value  # pydantic names what is wrong with it: the type, or an unknown key (a typo) first
        defaults = SAMPLER_DEFAULTS[kind]
        extra = sorted(k for k in (set(value) & set(SAMPLER_DEFAULTS["tpe"])) - set(defaults) if value[k] is not None)
        if extra:
            raise ValueError(
                f"{extra[0]!r} does not apply to type {value['type']!r}; leave it out (with --set, "
                f"replace the whole sampler: sampler={{type: {value['type']}, seed: 0}})"
            )
        return {**defaults, **{k: v for k, v in value.items() if v is not None}}

    @property
    def models(self) -> bool:
        """Whether proposals come from a model that starts after n_startup_trials."""
        return self.type in ("tpe", "gp")


class SchedulerSection(Section):
    type: Literal["none", "asha", "hyperband", "race"] = Field(
        default="none",
        description="asha: stop the trials behind at each rung (with several objectives, by "
        "non-dominated sorting: a trial on the rung's Pareto front goes on); hyperband: "
        "asynchronous Hyperband, ASHA in brackets whose first rungs come later and later "
        "(grace_period x factor^b), each trial in one, most in the first; race: ASHA's "
        "rungs racing the incumbent, a trial going on past a rung only if it is as good "
        "there as the best trial recorded at that rung so far (one objective; it may stop "
        "a slow starter ASHA would keep; docs/how-to/search.md); none: train every trial out",
    )
    grace_period: int | float = Field(
        default=1,
        gt=0,
        description="ASHA and race: the epochs trained at the first "
        "rung; a fraction (0.25) with "
        "train.validate_every validating at least that "
        "often",
    )
    reduction_factor: int = Field(
        default=2,
        ge=2,
        description="ASHA: 1 in this many trials goes on past each rung; "
        "rungs at grace_period x factor^k epochs (race: the "
        "rungs only)",
    )

    @property
    def label(self) -> str:
        """The scheduler's name in messages."""
        return {"asha": "ASHA", "hyperband": "Hyperband", "race": "racing ASHA"}.get(self.type, "no scheduler")

    def rungs(self, epochs: int) -> list[int | float]:
        """The epochs at which ASHA (Hyperband's first bracket) decides, in trials of ``epochs``."""
        return list(
            itertools.takewhile(
                lambda rung: rung < epochs, (self.grace_period * self.reduction_factor**k for k in itertools.count())
            )
        )

    def brackets(self, epochs: int) -> int:
        """Ray's brackets: one for ASHA; for Hyperband one per rung, each starting a rung later."""
        return max(1, len(self.rungs(epochs))) if self.type == "hyperband" else 1


class ResourcesSection(Section):
    cpu: float = Field(default=1.0, gt=0, description="CPUs Ray reserves for each trial")
    gpu: float = Field(
        default=0.0,
        ge=0,
        description="GPUs for each trial; a fraction packs several trials on one GPU, above 1 a whole number",
    )
    fuse: int = Field(
        default=1,
        ge=1,
        le=64,
        description="trials of one shape trained as one batched model in one Ray "
        "Tune trial, which gets cpu and gpu above; 1: each alone",
    )

    @model_validator(mode="after")
    def _whole(self) -> ResourcesSection:
        if self.gpu > 1 and not self.gpu.is_integer():
            raise ValueError(f"gpu={self.gpu}: above 1, GPUs per trial must be a whole number")
        return self


class BudgetSection(Section):
    cpu_hours: float | None = Field(
        default=None,
        gt=0,
        description="training wall time x CPUs per trial, summed over trials (one of cpu_hours, gpu_hours)",
    )
    gpu_hours: float | None = Field(
        default=None, gt=0, description="training wall time x GPU fraction per trial, summed over trials"
    )

    @model_validator(mode="after")
    def _one(self) -> BudgetSection:
        if len(self.model_fields_set) != 1:
            raise ValueError("budget must have exactly one of cpu_hours or gpu_hours")
        return self

    @property
    def unit(self) -> str:
        return "gpu" if self.gpu_hours else "cpu"

    @property
    def hours(self) -> float:
        return float(self.gpu_hours or self.cpu_hours or 0)


class NotifySection(Section):
    urls: tuple[str, ...] = Field(
        default=(),
        strict=False,
        description="where the Apprise URLs to tell are, read "
        "by the driver: env:NAME ($NAME) or "
        "file:/PATH (a file only its owner reads); "
        "never the URL itself, which holds a token",
    )
    events: tuple[Event, ...] = Field(default=EVENTS, strict=False, description="what they are told of")

    @model_validator(mode="after")
    def _understood(self) -> NotifySection:
        # A URL is never repeated in a message: it may hold a token. Apprise's URLs nearly all do (in
        # the path, the user or the query), so none is taken literally: a sweep file is shared, and
        # its settings are stored in sweep.json and logged to MLflow.
        for n, url in enumerate(self.urls):
            kind, _, rest = url.partition(":")
            if kind == "env" and not rest.isidentifier():
                raise ValueError(f"urls[{n}]: env:NAME needs an environment variable's name, not {rest!r}")
            if kind == "file" and not (rest.startswith("/") and not rest.startswith("//")):
                raise ValueError(f"urls[{n}]: file:/PATH needs an absolute path on the cluster, not {rest!r}")
            if kind not in ("env", "file"):
                raise ValueError(
                    f"urls[{n}] is a URL itself; give where the driver reads it instead: env:NAME "
                    "(an environment variable) or file:/PATH (a file only its owner reads, chmod 600)"
                )
        return self


class CheckpointsSection(Section):
    keep_best: int = Field(
        default=5,
        ge=1,
        description="how many of the best complete trials (the Pareto front's, "
        "with several objectives) keep their checkpoints once ended; "
        "every other ended trial keeps its progress, samples and "
        "metrics, but not its model: it cannot train on "
        "(`extend --epochs`)",
    )


class WarmStartSection(Section):
    sweeps: tuple[str, ...] = Field(
        alias="from",
        min_length=1,
        strict=False,
        description="earlier sweeps of this workspace with the same objective, at "
        "any fixed settings (another latent fraction, another input length)",
    )
    top: int = Field(
        default=5,
        ge=1,
        le=100,
        description="how many of each one's best complete trials (those whose "
        "searched values fit this sweep's space) run first",
    )


def listed(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def source_of(info: ValidationInfo) -> str:
    return str((info.context or {}).get("source", "the sweep file"))


DEFAULT_OBJECTIVE = Objective(metric=M.VAL_TOKEN_ACCURACY, mode="max")
