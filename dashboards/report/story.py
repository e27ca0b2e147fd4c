"""What a sweep found, the report's first lines, from its Optuna study."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import optuna

from dashboards.report.data import Trial
from seqae_core import names as N
from sweeps.spec.sweep import SweepSpec


@dataclass(frozen=True)
class Story:
    """What a sweep found, the report's first lines: read from its Optuna study, the record the
    search selected on, so it follows the sweep's objectives whatever they are."""

    found: list[str]  # the best trial (or the front), its validation and test scores, who proposed it
    starts: list[str]  # each starting point's trial, with the same scores
    proposed_by: str  # how many trials each proposer proposed
    cost: str  # what the trials spent, against the budget


def _scores(trial: optuna.trial.FrozenTrial, metrics: list[str]) -> str:
    """The trial's objectives on validation, and the same measures on test (``val_x``: ``test_x``)."""
    values = ", ".join(f"{m} {v:.4f}" for m, v in zip(metrics, trial.values or []))
    test = trial.user_attrs.get(N.TEST) or {}
    shown = ", ".join(f"{k} {test[k]:.4f}" for k in (m.replace("val_", "test_", 1) for m in metrics) if k in test)
    return f"{values} (validation, selected on)" + (
        f"; {shown} (test pages, never selected on)" if shown else "; no test score (no test split)"
    )


def story(storage: str, study_name: str, spec: SweepSpec, trials: list[Trial]) -> Story:
    """The story of the sweep of ``spec`` (its objectives and budget)."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    metrics = [o.metric for o in spec.objectives]
    complete = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state == optuna.trial.TrialState.COMPLETE and N.FORKED not in t.user_attrs
    ]
    if not complete:
        found = ["No trial has completed yet."]
    elif len(metrics) > 1:
        front = [t for t in study.best_trials if t in complete]
        found = [f"A front of {len(front)} trials on {' and '.join(metrics)}:"] + [
            f"trial {t.number}: {_scores(t, metrics)}" for t in sorted(front, key=lambda t: t.values[0])
        ]
    else:
        sign = spec.objectives[0].sign
        best = min(complete, key=lambda t: (-sign * t.values[0], t.number))
        by = (
            best.user_attrs.get(N.START)
            and f"starting point {best.user_attrs[N.START]}"
            or best.user_attrs.get(N.PROPOSED_BY, "unrecorded")
        )
        found = [f"The best trial is {best.number} (proposed by {by}): {_scores(best, metrics)}."]
    starts = [
        f"Starting point {t.user_attrs[N.START]}: trial {t.number}, "
        + (_scores(t, metrics) if t.state == optuna.trial.TrialState.COMPLETE else t.state.name.lower())
        for t in study.get_trials(deepcopy=False)
        if N.START in t.user_attrs
    ]
    proposers = Counter(
        t.user_attrs.get(N.PROPOSED_BY, "unrecorded")
        for t in study.get_trials(deepcopy=False)
        if N.FORKED not in t.user_attrs
    )
    unit = trials[0].resource if trials else "cpu"
    spent = sum(t.cost or 0.0 for t in trials) / 3600
    budget = spec.budget.hours if spec.budget and spec.budget.unit == unit else None
    return Story(
        found,
        starts,
        ", ".join(f"{who} {n}" for who, n in proposers.items()) or "no trial yet",
        f"{spent:.4f} {unit}-hours" + (f" of a budget of {budget:g}" if budget else ""),
    )
