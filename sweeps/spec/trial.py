"""A trial as it crosses from the driver's study into Tune, in a module of its own so that a trial's
worker process unpickles it without importing Optuna, a cost every trial's start would pay
(measured: docs/explanation/performance.md, "The figures behind the code's choices")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from seqae_core.borders import TuneConfig
from seqae_core.config import Config, Flat


@dataclass(frozen=True)
class TrialSpec:
    """A trial as it crosses into Tune: its number, the values its grid cell and the search set,
    and its config, built once, here. A config that cannot be built (an invalid combination of
    searched values) travels as its error: the trial fails with it, and the sweep goes on."""

    number: int
    params: Flat  # the values its grid cell and the search set, by config key
    config: Config | None
    error: str | None = None
    continued: bool = False  # an interrupted trial, to continue from its checkpoint
    start: str | None = None  # the starting point it is, by name

    @property
    def logged_params(self) -> Flat:
        """Every config key, with the latent length and fraction resolved; the bare values
        when the config could not be built."""
        if self.config is None:
            return dict(self.params)
        return {
            **self.config.flat(),
            "model.latent_len": self.config.latent_len,
            "model.latent_fraction": self.config.latent_fraction,
        }


@dataclass(frozen=True)
class WorkerSpec:
    """What the driver hands a Tune trial's worker, through Tune's config (:meth:`to_tune`, read back
    by :meth:`of_tune`): one trial (``sweeps.running.trial.run_trial``), or a pack's members
    (``run_pack``, ``resources.fuse``), the first of which is ``trial``, which Tune's parts read."""

    trial: TrialSpec
    pack: tuple[TrialSpec, ...] = ()  # a pack's members; none for a trial trained alone

    def __post_init__(self) -> None:
        numbers = [spec.number for spec in self.pack]
        if self.pack and (numbers[0] != self.trial.number or len(set(numbers)) != len(numbers)):
            raise ValueError(f"a pack's members {numbers} must be distinct trials, trial {self.trial.number} first")

    def to_tune(self) -> TuneConfig:
        """Tune's config of the trial: a dict, which Tune copies to the worker and hands its parts."""
        return {TRIAL: self.trial, **({PACK: self.pack} if self.pack else {})}

    @classmethod
    def of_tune(cls, config: Mapping[str, Any]) -> WorkerSpec:
        """From Tune's config of a trial (:meth:`to_tune`'s, with whatever the driver added to a stand-in)."""
        return cls(config[TRIAL], tuple(config.get(PACK, ())))


TRIAL, PACK = "trial", "pack"  # the keys of Tune's config that WorkerSpec fills
