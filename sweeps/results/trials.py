"""A sweep's trials as typed records, read once from its stores: the Optuna study (state,
parameters, objective values, starting point, proposer, test scores), each trial's checkpoint
records (its epochs, the kept epoch's metrics, cost) and, where the caller read them, its MLflow
runs (run id, node). `status` reads them without MLflow, so that it answers in about a second;
`export`, `compare` and :meth:`seqae.api.Sweep.trials` with it (:func:`sweeps.results.export.trials`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial

from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.pareto import ranks
from seqae_core.records import RecordStore
from sweeps.spec.sweep import SweepSpec
from sweeps.stores.continuations import attempts
from sweeps.stores.ledger import Outcome, resource_seconds
from sweeps.stores.search import SweepStudy, feasible, kept_record


@dataclass(frozen=True)
class Run:
    """What a trial's MLflow run adds to its record."""

    run_id: str
    node: str  # the Ray node the trial last ran on


@dataclass(frozen=True)
class Trial:
    """A trial of a sweep as its stores hold it (:mod:`sweeps.results.export`'s docstring says what
    each column, and so each field, is)."""

    number: int
    start: str  # a starting point's name; "" for a proposed trial
    state: str  # Optuna's
    outcome: str  # complete, pruned, failed, interrupted
    proposed_by: str
    ended: str  # ISO 8601, UTC; "" while it runs or waits to continue
    params: dict[str, Any]
    values: dict[str, float]  # each objective's value, as the search selected on; {} before it has one
    kept_epoch: int | None
    last_epoch: int | None
    metrics: dict[str, float | None]  # at the kept epoch: val_*, test_*, *_stderr, the other objectives
    test: (
        dict[str, float] | None
    )  # the kept checkpoint's test scores, as the study holds them; None without a test split
    seeds: dict[str, Any] | None  # with train.repeats > 1: each seed's value and the standard error
    feasible: bool | None  # with constraints; None for a trial that did not finish
    pareto_rank: int | None  # with several objectives
    cost_seconds: float  # resource-seconds: training wall time x the CPUs or GPU fraction held
    node: str  # "" where its MLflow run was not read
    mlflow_run_id: str  # "" where its MLflow run was not read
    attempts: int  # how many attempts its configuration took: more than 1 once `seqae sweep retry` retried it


def pareto_ranks(trials: list[FrozenTrial], modes: Sequence[str]) -> dict[int, int]:
    """Each complete trial's Pareto rank (:func:`seqae_core.pareto.ranks`) by its objective values, by trial number."""
    done = [t for t in trials if t.values is not None and t.state.name == "COMPLETE"]
    if not done:
        return {}
    return {t.number: int(r) for t, r in zip(done, ranks([t.values for t in done], modes))}


def unreadable(storage: str) -> str | None:
    """Why this machine cannot read the trials' checkpoint records in ``storage``, or None. The
    storage is the cluster's: a laptop that submits through tunnels may hold no credentials for
    its bucket, nor mount its folder."""
    try:
        RecordStore.trials(storage)
    except OSError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"the trials' checkpoint records in {storage} are not readable from this machine ({reason}): "
            "their epochs and cost are not shown"
        )
    return None


def read_trials(
    spec: SweepSpec, study: SweepStudy, storage: str | None, runs: Mapping[int, Run] | None = None
) -> list[Trial]:
    """Every trial of ``study`` in number order, with its checkpoint records from ``storage`` (none
    where None: :func:`unreadable`) and, for the trials ``runs`` names, its MLflow run."""
    runs = runs or {}
    found = study.trials()
    objectives = [o.metric for o in spec.objectives]
    met = {t.number: feasible(t) for t in found}
    several = spec.multi_objective
    rank = pareto_ranks([t for t in found if met[t.number]], [o.mode for o in spec.objectives]) if several else {}
    # the objectives beyond the validation and test metrics every record has (the latent's size)
    extra = [m for m in objectives if m not in (*M.VAL_METRICS, *M.TEST_METRICS)]
    progresses = RecordStore.progress_of(storage, [t.number for t in found]) if storage is not None else {}
    records = []
    for trial in found:
        progress = progresses.get(trial.number)
        history = progress.history if progress else []
        kept = kept_record(history) if history else {}
        run = runs.get(trial.number)
        records.append(
            Trial(
                number=trial.number,
                start=trial.user_attrs.get(N.START, ""),
                state=trial.state.name,
                outcome=Outcome(trial.state.name).label,
                proposed_by=trial.user_attrs.get(N.PROPOSED_BY, ""),
                ended=trial.datetime_complete.isoformat() if trial.datetime_complete else "",
                params=spec.values_of(trial.params),
                values=dict(zip(objectives, trial.values or [])),
                kept_epoch=kept.get(M.EPOCH),
                last_epoch=history[-1][M.EPOCH] if history else None,
                metrics={
                    **{k: kept.get(k) for k in (*M.VAL_METRICS, *M.TEST_METRICS)},
                    **{k: v for k, v in kept.items() if k.endswith("_stderr")},
                    **{k: kept.get(k) for k in extra},
                },
                test=trial.user_attrs.get(N.TEST),
                seeds=trial.user_attrs.get(N.SEEDS),
                feasible=met[trial.number] if trial.state.is_finished() else None,
                pareto_rank=rank.get(trial.number),
                cost_seconds=resource_seconds(spec.share[1], progress),
                node=run.node if run else "",
                mlflow_run_id=run.run_id if run else "",
                attempts=attempts(trial),
            )
        )
    return records
