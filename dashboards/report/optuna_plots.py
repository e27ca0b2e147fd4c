"""Optuna's own plots of a sweep's study: its optimization history, parameter importances and
parallel coordinates, or the Pareto front of a multi-objective sweep."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import optuna
from optuna.visualization import matplotlib as ovm

from dashboards.report.figures import MANY, save_figure

IMPORTANCE_TRIALS = 5


def optuna_figures(storage: str, study_name: str, out: Path) -> tuple[list[Path], list[str]]:
    """Optuna's own plots; returns the figures and notes on the ones the study cannot have yet."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    # (file, label, the completed trials it needs, how to draw it): fANOVA's forest fitted to fewer
    # than IMPORTANCE_TRIALS points ranks noise, and costs a scikit-learn import to say so
    plots = (
        [("optuna_pareto_front.png", "Pareto front", 2, lambda: ovm.plot_pareto_front(study))]
        if len(study.directions) > 1
        else [
            ("optuna_history.png", "optimization history", 2, lambda: ovm.plot_optimization_history(study)),
            (
                "optuna_importances.png",
                "parameter importances",
                IMPORTANCE_TRIALS,
                lambda: ovm.plot_param_importances(study),
            ),
            ("optuna_parallel.png", "parallel coordinates", 2, lambda: ovm.plot_parallel_coordinate(best_of(study))),
        ]
    )
    paths, notes = [], []
    for file_name, label, needs, draw in plots:
        if len(complete) < needs:
            notes.append(f"Optuna {label}: needs {needs} completed trials, the study has {len(complete)}")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the matplotlib backend is marked experimental
                draw()
            fig = plt.gcf()  # Optuna draws into a new current figure
            fig.set_size_inches(8, 4.8)
            paths.append(save_figure(fig, out / file_name))
        except (ValueError, RuntimeError) as exc:  # e.g. importances when no parameter varies
            notes.append(f"Optuna {label}: {exc}")
            plt.close("all")
    return paths, notes


def best_of(study: optuna.Study, n: int = MANY) -> optuna.Study:
    """The study itself, or for one of more than ``n`` complete trials an in-memory copy of its
    ``n`` best (a line per trial of thousands is a smear)."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) <= n or len(study.directions) > 1:
        return study
    sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
    top = optuna.create_study(directions=study.directions)
    if study.metric_names:
        top.set_metric_names(study.metric_names)
    top.add_trials(sorted(complete, key=lambda t: sign * t.values[0])[:n])
    return top
