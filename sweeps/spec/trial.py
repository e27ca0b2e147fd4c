"""A trial as it crosses from the driver's study into Tune, in a module of its own so that a trial's
worker process unpickles it without importing Optuna, a cost every trial's start would pay
(measured: docs/explanation/performance.md, "The figures behind the code's choices")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seqae_core.config import Config


@dataclass(frozen=True)
class TrialSpec:
    """A trial as it crosses into Tune: its number, the values its grid cell and the search set,
    and its config, built once, here. A config that cannot be built (an invalid combination of
    searched values) travels as its error: the trial fails with it, and the sweep goes on."""

    number: int
    params: dict[str, Any]
    config: Config | None
    error: str | None = None
    continued: bool = False  # an interrupted trial, to continue from its checkpoint
    start: str | None = None  # the starting point it is, by name

    @property
    def logged_params(self) -> dict[str, Any]:
        """Every config key, with the latent length and fraction resolved; the bare values
        when the config could not be built."""
        if self.config is None:
            return dict(self.params)
        return {**self.config.flat(), "model.latent_len": self.config.latent_len,
                "model.latent_fraction": self.config.latent_fraction}
