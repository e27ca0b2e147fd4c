"""seqae from Python, for notebooks and scripts: a sweep is a :class:`Sweep`, which runs, resumes,
extends, stops and reads what the command line does (the command line is a thin layer over it).
A refusal is a :class:`~seqae_errors.ConfigError` naming the key or value, a database that stayed
away a :class:`~seqae_errors.StorageUnreachable`; nothing here exits or prints a table.

    from sweeps.api import Sweep

    sweep = Sweep.run("sweeps/studies/quickstart.yaml", set=["data.path=../shared/data/wikipedia-mini"])
    sweep.status().best             # the best trial: validation (selected on) and test values
    table = sweep.trials()          # a pandas DataFrame, a row per trial (export's columns)
    model = sweep.best_model()      # the registered model: model.predict(["some text"])
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pandas as pd

from seqae_errors import ConfigError
from sweeps import driver, export, lifecycle, registry, status
from sweeps.workspace import Workspace

BACKENDS = ("storage", "mlflow_tracking_uri", "optuna_storage")  # what ``backends=`` may name


class Sweep:
    """Sweep ``name`` in ``workspace`` (a folder; unset: ``$SEQAE_WORKSPACE``, else ``./seqae-runs``).
    Opening an unknown sweep is refused. ``exit_code`` is what its last run, resume or extend in
    this process ended with, as the command line would exit: 0 when it completed or was stopped,
    else the driver's code for an interrupted sweep (it continues with :meth:`resume`)."""

    def __init__(self, name: str, workspace: str | Path | Workspace | None = None) -> None:
        self.workspace = _workspace(workspace)
        self.workspace.read(name)  # an unknown sweep is refused, naming it
        self.name = name
        self.exit_code: int | None = None

    def __repr__(self) -> str:
        return f"Sweep({self.name!r}, workspace={str(self.workspace.root)!r})"

    @classmethod
    def open(cls, name: str, workspace: str | Path | Workspace | None = None) -> Sweep:
        return cls(name, workspace)

    @classmethod
    def create(cls, file: str | Path, *, set: list[str] | tuple[str, ...] = (), profile: str | None = None,
               name: str | None = None, workspace: str | Path | Workspace | None = None, or_resume: bool = False,
               backends: dict[str, str | None] | None = None) -> Sweep:
        """Check sweep ``file`` with its ``profile`` and ``set`` overrides (``"key=value"``, as
        ``--set``) and record it, without running it; ``backends`` may name ``storage``,
        ``mlflow_tracking_uri`` and ``optuna_storage`` (else the workspace's own). With ``or_resume``
        an existing sweep of that name is taken if the file still describes it."""
        place = _workspace(workspace)
        sets = _sets(set, profile)
        overrides = dict.fromkeys(BACKENDS) | (backends or {})
        unknown = sorted(overrides.keys() - frozenset(BACKENDS))
        if unknown:
            raise ConfigError(f"backends: unknown key {unknown[0]!r}; choose from {', '.join(BACKENDS)}")
        created = lifecycle.create(place, str(file), name, sets, overrides, or_resume=or_resume)
        return cls(created, place)

    @classmethod
    def run(cls, file: str | Path, *, set: list[str] | tuple[str, ...] = (), profile: str | None = None,
            name: str | None = None, workspace: str | Path | Workspace | None = None, or_resume: bool = False,
            backends: dict[str, str | None] | None = None, verbose: bool = False) -> Sweep:
        """:meth:`create` the sweep, then run its trials here (on the Ray that ``RAY_ADDRESS``
        names, else a local one) until it ends; the progress lines print as they come."""
        sweep = cls.create(file, set=set, profile=profile, name=name, workspace=workspace, or_resume=or_resume,
                           backends=backends)
        sweep.exit_code = driver.drive(sweep.workspace, sweep.name, report=_report(), check_file=False, verbose=verbose)
        return sweep

    @classmethod
    def fork(cls, origin: str, file: str | Path, *, set: list[str] | tuple[str, ...] = (),
             profile: str | None = None, name: str | None = None, workspace: str | Path | Workspace | None = None,
             verbose: bool = False) -> Sweep:
        """A new sweep from ``file`` whose study starts with sweep ``origin``'s finished trials that
        fit its space, run until it ends."""
        place = _workspace(workspace)
        sweep = cls(lifecycle.fork(place, origin, str(file), name, _sets(set, profile), {}), place)
        sweep.exit_code = driver.drive(sweep.workspace, sweep.name, report=_report(), check_file=False, verbose=verbose)
        return sweep

    def resume(self, *, allow_code_change: bool = False, verbose: bool = False) -> Sweep:
        """Run what is left of the sweep: interrupted trials from their newest checkpoint, then the
        trials not yet started."""
        self.exit_code = driver.drive(self.workspace, self.name, report=_report(), verbose=verbose,
                                      allow_code_change=allow_code_change)
        return self

    def extend(self, *, trials: int | None = None, epochs: int | None = None, which: str = "best:1",
               allow_code_change: bool = False, verbose: bool = False) -> Sweep:
        """``trials`` more trials, or (with ``epochs``) the finished trials ``which`` names
        (``best:K`` or ``3,5``) trained on to ``epochs``; then run them."""
        if (trials is None) == (epochs is None):
            raise ConfigError("extend: give trials=N (more trials) or epochs=N (train finished trials on), not both")
        driver.check_code(self.workspace.read(self.name), allow_code_change)  # before the sweep is changed
        if epochs is not None:
            for note in lifecycle.extend_epochs(self.workspace, self.name, epochs, which):
                print(f"seqae: {note}", flush=True)
        else:
            lifecycle.extend(self.workspace, self.name, int(trials or 0))
        self.exit_code = driver.drive(self.workspace, self.name, report=_report(), verbose=verbose,
                                      extending=epochs is not None, allow_code_change=allow_code_change)
        return self

    def stop(self, reason: str | None = None, now: bool = False) -> None:
        """Start no new trials, wherever its driver runs; the running ones finish, or with ``now``
        stop at the end of their epoch, for a resume to continue them from there."""
        lifecycle.control(self.workspace, self.name, drain=reason or f"stopped from Python on {socket.gethostname()}",
                          **({"now": True} if now else {}))

    def set_max_concurrent(self, trials: int) -> None:
        """Run at most ``trials`` at once, from the driver's next trial on."""
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
            raise ConfigError(f"max_concurrent={trials!r} must be a whole number of at least 1")
        lifecycle.control(self.workspace, self.name, max_concurrent=trials)

    def status(self) -> status.SweepStatus:
        """What ``seqae sweep status`` shows: trials by state, the best (validation and test), the
        cost against the budget, where its runs and study live (``.as_json()``: what ``--json``
        prints)."""
        return status.status(self.workspace, self.name)

    def trials(self) -> pd.DataFrame:
        """A row per trial, the columns of ``seqae sweep export`` (:mod:`sweeps.export`)."""
        return export.trial_table(self.workspace, self.name)

    def export(self, out: str | Path | None = None, format: str | None = None) -> Path:
        """:meth:`trials` written to ``out`` as ``format`` (csv, parquet or jsonl; unset: what
        ``out``'s suffix names); an existing file is refused."""
        return export.export(self.workspace, self.name, format, None if out is None else str(out))

    def best_model(self) -> Any:
        """The registered model of the sweep's best trial (alias ``@best``), an MLflow pyfunc:
        ``.predict(["text", ...])`` gives each text's reconstruction and token accuracy."""
        return registry.load_registered(self.workspace.read(self.name).backends.mlflow_tracking_uri, self.name)[1]

    def compare(self, *others: str | Sweep, out: str | Path | None = None) -> tuple[str, Path]:
        """This sweep beside ``others`` (of the same objective, in the same workspace): the
        terminal's table and the written page."""
        from dashboards import compare  # the dashboards sit above the sweep service: only its front door reaches up

        names = [self.name, *(o.name if isinstance(o, Sweep) else o for o in others)]
        return compare.compare(self.workspace, names, None if out is None else str(out))

    def report(self) -> Path:
        """Write the sweep's report (also logged to its MLflow run); its ``index.html``."""
        try:
            return _report()(self.workspace.read(self.name), self.workspace.report_dir(self.name))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _report() -> driver.Report:
    """What writes a sweep's report (the driver calls it as each session ends)."""
    from dashboards.report import page  # the dashboards sit above the sweep service: only its front door reaches up

    return page.build


def _workspace(workspace: str | Path | Workspace | None) -> Workspace:
    return workspace if isinstance(workspace, Workspace) else Workspace(workspace)


def _sets(overrides: list[str] | tuple[str, ...], profile: str | None) -> list[str]:
    """The profile is the first override, so every ``set`` applies on top of it (as ``--profile``)."""
    return ([f"profile={profile}"] if profile else []) + list(overrides)
