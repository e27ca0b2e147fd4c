"""`seqae sweep export`: every trial of a sweep as one table, to take into pandas, a paper or a
spreadsheet. A row per trial, read from the stores the sweep keeps: the Optuna study (state,
parameters, starting point), each trial's checkpoint records (its epochs, the epoch early stopping
kept, validation and test metrics, cost) and its MLflow run (run id, node).

Columns, in order:

    trial            the trial's number
    start            a starting point's name in the sweep file (empty for a proposed trial)
    state            Optuna's state: COMPLETE, PRUNED, FAIL, RUNNING (interrupted)
    outcome          complete, pruned, failed, interrupted (the MLflow run's ``seqae.outcome``)
    proposed_by      start, grid, random start-up, or the sampler that proposed it
    ended            when it ended (ISO 8601, UTC; empty while it runs or waits to continue)
    param.KEY        each searched or grid key, as the trial ran it
    kept_epoch       the epoch early stopping kept (the first of the best validation accuracy)
    last_epoch       the last epoch trained
    val_*, test_*    the kept epoch's validation metrics, and its test metrics (never selected on)
    OBJECTIVE        with several objectives: each objective's value that is not a val_* column
                     (``latent_share``, for example), at the kept epoch
    feasible         with constraints: whether the trial's kept checkpoint met every one
    pareto_rank      with several objectives: 1 for the trials on the front (no finished trial is
                     as good in every objective and better in one), 2 for those only rank 1 beats,
                     ...; among the trials that met the constraints; empty for the others and for
                     a trial that did not finish
    *_stderr         with train.repeats > 1: the standard error over the seeds (each seed's value
                     is in MLflow)
    cost_seconds     resource-seconds spent: training wall time x the CPUs or GPU fraction held
    node             the Ray node the trial last ran on
    mlflow_run_id    the trial's MLflow run (its latest attempt's)
    attempts         how many attempts its configuration took: 1, more once `seqae sweep retry` retried
                     it (each failed attempt's run keeps its error, tagged ``seqae.attempt_of``)
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import pandas as pd
from mlflow.tracking import MlflowClient

from seqae_core import names as N
from seqae_errors import ConfigError
from sweeps.results.trials import Run, Trial, read_trials
from sweeps.stores.mlflow_access import check_credentials
from sweeps.stores.mlflow_runs import all_runs
from sweeps.stores.search import read_only
from sweeps.stores.workspace import Workspace

FORMATS = {"csv": ".csv", "parquet": ".parquet", "jsonl": ".jsonl"}


@dataclass(frozen=True)
class Trials(Sequence[Trial]):
    """A sweep's trials in number order; :meth:`to_pandas` is ``seqae sweep export``'s table."""

    records: tuple[Trial, ...]
    constrained: bool  # the sweep has constraints: the table has a feasible column
    several: bool  # several objectives: the table has a pareto_rank column

    def __len__(self) -> int:
        return len(self.records)

    @overload
    def __getitem__(self, index: int) -> Trial: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Trial]: ...

    def __getitem__(self, index: int | slice) -> Trial | Sequence[Trial]:
        return self.records[index]

    def to_pandas(self) -> pd.DataFrame:
        table = pd.DataFrame(
            [
                {
                    "trial": t.number,
                    "start": t.start,
                    "state": t.state,
                    "outcome": t.outcome,
                    "proposed_by": t.proposed_by,
                    "ended": t.ended,
                    **{f"param.{k}": v for k, v in t.params.items()},
                    "kept_epoch": t.kept_epoch,
                    "last_epoch": t.last_epoch,
                    **t.metrics,
                    **({"feasible": t.feasible} if self.constrained else {}),
                    **({"pareto_rank": t.pareto_rank} if self.several else {}),
                    "cost_seconds": round(t.cost_seconds, 3),
                    "node": t.node,
                    "mlflow_run_id": t.mlflow_run_id,
                    "attempts": t.attempts,
                }
                for t in self.records
            ]
        )
        if self.several:  # whole numbers, empty where a trial did not finish
            table["pareto_rank"] = table["pareto_rank"].astype("Int64")
        return table


def trials(workspace: Workspace, name: str) -> Trials:
    """Every trial of sweep ``name``, read from its Optuna study, its trials' records and its MLflow runs."""
    state = workspace.read(name)
    spec, backends = state.spec, state.backends
    runs: dict[int, Run] = {}
    if state.mlflow_experiment_id is not None:
        check_credentials(backends.mlflow_tracking_uri)
        client = MlflowClient(backends.mlflow_tracking_uri)
        runs = {
            int(r.data.tags[N.TRIAL]): Run(r.info.run_id, r.data.tags.get(N.NODE_IP, ""))
            for r in all_runs(client, state.mlflow_experiment_id)
            if N.TRIAL in r.data.tags
        }
    study = read_only(spec, backends.optuna_storage, state.study_name)
    return Trials(tuple(read_trials(spec, study, backends.storage, runs)), bool(spec.constraints), spec.multi_objective)


def trial_table(workspace: Workspace, name: str) -> pd.DataFrame:
    """A row per trial of sweep ``name`` (the module's docstring lists the columns)."""
    return trials(workspace, name).to_pandas()


def export(workspace: Workspace, name: str, fmt: str | None, out: str | None) -> Path:
    """Write sweep ``name``'s trial table as ``fmt`` to ``out`` (default ``NAME-trials.EXT`` here;
    missing folders are made, as compare makes them). The format is ``fmt``, else the one ``out``'s
    suffix names, else CSV; a suffix naming another format than ``fmt``, an unknown format or an
    existing file is refused before anything is read, and the file appears whole or not at all."""
    named = next((f for f, suffix in FORMATS.items() if out and Path(out).suffix == suffix), None)
    fmt = fmt or named or "csv"
    if fmt not in FORMATS:
        raise ConfigError(f"--format={fmt!r}: choose from {', '.join(FORMATS)}")
    if named and named != fmt:
        raise ConfigError(
            f"--format={fmt} but --out={out} names {named}: give the file a {FORMATS[fmt]} suffix, "
            "or leave --format out to write what the suffix names"
        )
    path = Path(out or f"{name}-trials{FORMATS[fmt]}")
    if path.exists():
        raise ConfigError(f"--out={path}: the file exists; remove it or choose another")
    workspace.read(name)  # an unknown sweep is refused, naming it
    table = trial_table(workspace, name)
    partial = path.with_name(f".{path.name}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "csv":
            table.to_csv(partial, index=False)
        elif fmt == "parquet":
            table.to_parquet(partial, index=False)
        else:
            table.to_json(partial, orient="records", lines=True)
        partial.rename(path)
    except OSError as e:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise ConfigError(f"--out={path}: cannot write it ({e.strerror or e})") from None
    return path
