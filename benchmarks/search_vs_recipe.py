"""``seqae bench search``: does the search find better models than the paper's recipe, and than a
random search, for the same CPU-seconds? Scored on the test pages, which nothing selected on.

At 50%, 25% and 12.5% latent (32 -> 16, 8 and 4 tokens on the offline corpus), every arm is a real
``seqae sweep run`` on the same data, split and epochs:

    recipe     the paper's configuration (:data:`RECIPE`), trained from seeds 1-3
    random     a random search over :data:`SPACE`, the recipe enqueued as its first trial
    tpe+asha   TPE with the quickstart's sampler settings and ASHA (grace 1, factor 2), the recipe
               enqueued first

Each search runs from 3 sampler seeds, different at each fraction (the two searches share them),
trains from seed 0, and holds a budget of :data:`BUDGET_TRAININGS` recipe trainings in
CPU-seconds (what the recipe arm measured at that fraction): the sweep's own ``budget``, which
stops running trials once it is spent. The search's best trial by validation is trained again
from seeds 1-3 and scored once on test; when it is the recipe, the recipe arm's numbers are used.
A gain is paired by training seed and its interval resamples search seeds, then training seeds
(:mod:`benchmarks.intervals`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import optuna
import pandas as pd

from benchmarks.intervals import holm, interval
from benchmarks.sweep_runs import run_sweep
from seqae_core import metrics as M
from seqae_core import names as N

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FRACTIONS = (0.5, 0.25, 0.125)
INPUT_LEN = 32
EPOCHS = 5  # the paper's learning-rate decay, 1e-3 -> 1e-4 over 5 epochs, to its end
TRAINING_SEEDS = (1, 2, 3)
SEARCH_SEEDS = 3
BUDGET_TRAININGS = 6  # a search's budget: this many recipe trainings' CPU-seconds, its enqueued recipe included
ARMS = ("random", "tpe+asha")
TABLES = Path(__file__).resolve().parent / "tables"

RECIPE = {  # the paper's Table I at the laptop profiles' halved widths, with the residual they need
    "model.block": "paper", "model.d_model": 128, "model.d_attn": 256, "model.layers": 1,
    "model.reduction": "gradual", "model.dropout": 0.0, "train.lr": 1.0e-3,
}
SPACE = {
    "model.block": {"type": "categorical", "choices": ["paper", "transformer"]},
    "train.lr": {"type": "loguniform", "low": 3.0e-4, "high": 1.0e-2},
    "model.d_model": {"type": "categorical", "choices": [64, 128, 256]},
    "model.d_attn": {"type": "categorical", "choices": [64, 128, 256]},
    "model.layers": {"type": "int", "low": 1, "high": 2},
    "model.reduction": {"type": "categorical", "choices": ["gradual", "once"]},
    "model.dropout": {"type": "uniform", "low": 0.0, "high": 0.2},
    "model.heads": {"type": "categorical", "choices": [1, 2, 4, 8], "when": {"model.block": "transformer"}},
}
SAMPLERS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {  # the quickstart's settings (sweeps/studies/quickstart.yaml)
    "random": ({"type": "random"}, {"type": "none"}),
    "tpe+asha": ({"type": "tpe", "n_startup_trials": 2, "multivariate": True, "group": True, "constant_liar": True},
                 {"type": "asha", "grace_period": 1, "reduction_factor": 2}),
}


def document(data_path: str, description: str, fixed: dict[str, Any]) -> dict[str, Any]:
    """A sweep of the benchmark's data, split and schedule, with ``fixed`` config keys set."""
    config: dict[str, dict[str, Any]] = {
        "data": {"path": data_path, "samples": "windows", "input_len": INPUT_LEN, "max_pages": 30,
                 "vocab": "corpus", "test_fraction": 0.1},
        "model": {"residual": True, "d_ffn": 512},
        "train": {"epochs": EPOCHS, "patience": 5, "batch_size": 16, "lr_final": 1.0e-4, "lr_schedule": "linear",
                  "lr_decay_epochs": 5, "precision": "auto"},
    }
    for key, value in fixed.items():
        section, name = key.split(".", 1)
        config[section][name] = value
    return {"description": description, "config": config, "objective": {"metric": M.VAL_TOKEN_ACCURACY, "mode": "max"},
            "resources": {"cpu": 1, "gpu": 0}, "max_concurrent": 2}


def _trained(data_path: str, fixed: dict[str, Any], fractions: list[float]) -> dict[str, Any]:
    """``fixed`` trained from each of the training seeds at each of ``fractions``."""
    doc = document(data_path, "a configuration trained from seeds 1-3", fixed)
    doc["grid"] = {"model.latent_fraction": fractions, "train.seed": list(TRAINING_SEEDS)}
    doc["trials"] = {"per_cell": 1}
    return doc


def _search(data_path: str, arm: str, fraction: float, seed: int, budget_seconds: float) -> dict[str, Any]:
    doc = document(data_path, f"{arm} at {fraction:.1%} latent, sampler seed {seed}",
                    {"model.latent_fraction": fraction, "train.seed": 0})
    sampler, scheduler = SAMPLERS[arm]
    doc.update(search=SPACE, start={"recipe": RECIPE}, trials={"total": 60}, sampler={**sampler, "seed": seed},
               scheduler=scheduler, budget={"cpu_hours": budget_seconds / 3600})
    return doc


def _study(workspace: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{workspace / 'optuna.db'}")


@dataclass(frozen=True)
class Scores:
    """A configuration trained from each training seed: validation (kept epoch) and test, in seed order."""

    val: tuple[float, ...]
    test: tuple[float, ...]
    cpu_seconds: float  # one training's, the seeds' mean


def _scores(workspace: Path, name: str, fraction: float, runs: list[Any]) -> Scores:
    trials = sorted((t for t in _study(workspace, name).trials
                     if t.params.get("model.latent_fraction", fraction) == fraction and t.value is not None),
                    key=lambda t: t.params["train.seed"])
    assert [t.params["train.seed"] for t in trials] == list(TRAINING_SEEDS), [t.params for t in trials]
    numbers = {str(t.number) for t in trials}
    cost = [r.data.metrics[M.RESOURCE_SECONDS] for r in runs if r.data.tags[N.TRIAL] in numbers]
    return Scores(tuple(float(t.value) for t in trials),  # type: ignore[arg-type]
                  tuple(float(t.user_attrs[N.TEST][M.TEST_TOKEN_ACCURACY]) for t in trials), statistics.fmean(cost))


@dataclass(frozen=True)
class Search:
    arm: str
    fraction: float
    seed: int
    best_val: float  # the best trial's validation accuracy, which chose it (training seed 0)
    config: dict[str, Any]  # the best trial's searched keys
    is_recipe: bool
    trials: int
    cpu_seconds: float  # spent by the whole search
    scores: Scores  # the best configuration trained again from the training seeds


def _searched(folder: Path, data_path: str, arm: str, fraction: float, seed: int, recipe: Scores) -> Search:
    name = f"{arm.replace('+', '-')}-{int(fraction * 1000)}-s{seed}"
    _, runs = run_sweep(folder, name, _search(data_path, arm, fraction, seed, BUDGET_TRAININGS * recipe.cpu_seconds))
    best = _study(folder / "ws", name).best_trial
    is_recipe = best.user_attrs.get(N.START) == "recipe"
    config = {k: v for k, v in best.params.items() if k in SPACE}
    if is_recipe:
        scores = recipe
    else:
        retrain = f"{name}-best"
        _, reruns = run_sweep(folder, retrain, _trained(data_path, config, [fraction]))
        scores = _scores(folder / "ws", retrain, fraction, reruns)
    spent = sum(r.data.metrics.get(M.RESOURCE_SECONDS, 0.0) for r in runs)
    return Search(arm, fraction, seed, float(best.value), config, is_recipe, len(runs), spent, scores)  # type: ignore[arg-type]


def _short(config: dict[str, Any]) -> str:
    """``{"model.d_model": 128, "train.lr": 0.00123}`` -> ``d_model=128 lr=1.2e-03``."""
    return " ".join(f"{k.split('.', 1)[1]}={v:.1e}" if isinstance(v, float) and k == "train.lr"
                    else f"{k.split('.', 1)[1]}={round(v, 3) if isinstance(v, float) else v}"
                    for k, v in sorted(config.items()))


def summarize(recipe: dict[float, Scores], searches: list[Search]) -> list[dict[str, Any]]:
    """A row per fraction and arm: test accuracy (mean and standard deviation over every search
    seed and training seed), the gain over the recipe paired by training seed with its 95%
    interval and Holm-adjusted one-sided p (over the fractions, per arm), wins out of the search
    seeds, the validation-to-test drop, CPU-seconds and the chosen configurations; then a row per
    fraction for tpe+asha against random, paired by sampler seed and training seed."""
    rows: list[dict[str, Any]] = []
    for fraction in sorted(recipe, reverse=True):
        r = recipe[fraction]
        rows.append({"latent": f"{INPUT_LEN}->{round(fraction * INPUT_LEN)}", "arm": "recipe",
                     "test_mean": round(statistics.fmean(r.test), 4), "test_sd": round(statistics.stdev(r.test), 4),
                     "val_to_test_drop": round(statistics.fmean(r.val) - statistics.fmean(r.test), 4),
                     "cpu_s": round(len(r.test) * r.cpu_seconds), "chosen": "recipe"})
    comparisons: list[tuple[dict[str, Any], float]] = []
    for arm in ARMS:
        arm_rows = []
        for fraction in sorted(recipe, reverse=True):
            mine = sorted((s for s in searches if s.arm == arm and s.fraction == fraction), key=lambda s: s.seed)
            if not mine:
                continue
            tests = np.array([s.scores.test for s in mine])
            gain = interval(tests - np.array(recipe[fraction].test))
            recipe_mean = statistics.fmean(recipe[fraction].test)
            arm_rows.append(({
                "latent": f"{INPUT_LEN}->{round(fraction * INPUT_LEN)}", "arm": arm,
                "test_mean": round(float(tests.mean()), 4), "test_sd": round(float(tests.std(ddof=1)), 4),
                "gain_points": round(100 * gain.mean, 2),
                "gain_95ci": f"[{100 * gain.low:+.2f}, {100 * gain.high:+.2f}]",
                "wins": f"{sum(float(np.mean(s.scores.test)) > recipe_mean for s in mine)}/{len(mine)}",
                "val_to_test_drop": round(statistics.fmean(s.best_val - float(np.mean(s.scores.test)) for s in mine), 4),
                "cpu_s": round(statistics.fmean(s.cpu_seconds for s in mine)),
                "budget_cpu_s": round(BUDGET_TRAININGS * recipe[fraction].cpu_seconds),
                "trials": round(statistics.fmean(s.trials for s in mine), 1),
                "chosen": " | ".join("recipe" if s.is_recipe else _short(s.config) for s in mine),
            }, gain.p))
        comparisons += arm_rows
        for (row, _), adjusted in zip(arm_rows, holm([p for _, p in arm_rows])):
            row["p_holm"] = round(adjusted, 4)
    rows += [row for row, _ in comparisons]
    for fraction in sorted(recipe, reverse=True):
        pairs = [sorted((s for s in searches if s.arm == arm and s.fraction == fraction), key=lambda s: s.seed)
                 for arm in ARMS]
        if all(pairs) and [s.seed for s in pairs[0]] == [s.seed for s in pairs[1]]:
            gain = interval(np.array([s.scores.test for s in pairs[1]]) - np.array([s.scores.test for s in pairs[0]]))
            rows.append({"latent": f"{INPUT_LEN}->{round(fraction * INPUT_LEN)}", "arm": "tpe+asha - random",
                         "gain_points": round(100 * gain.mean, 2),
                         "gain_95ci": f"[{100 * gain.low:+.2f}, {100 * gain.high:+.2f}]"})
    return rows


def _tests(recipe: dict[float, Scores], searches: list[Search], arm: str, fraction: float) -> list[float]:
    """Every test accuracy of ``arm`` at ``fraction``: each training seed of each search seed."""
    if arm == "recipe":
        return list(recipe[fraction].test)
    return [v for s in searches if s.arm == arm and s.fraction == fraction for v in s.scores.test]


def figure(recipe: dict[float, Scores], searches: list[Search], path: Path) -> Path:
    """Test accuracy per fraction, each training of each arm a dot and the arm's mean a line, in
    the report's style."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    fractions = sorted(recipe)
    for n, arm in enumerate(("recipe",) + ARMS):
        xs, means = [], []
        for i, fraction in enumerate(fractions):
            values = _tests(recipe, searches, arm, fraction)
            if values:
                x = i + 0.12 * (n - 1)
                ax.scatter([x] * len(values), values, s=14, alpha=0.5, color=f"C{n}")
                xs.append(x)
                means.append(statistics.fmean(values))
        ax.plot(xs, means, marker="o", color=f"C{n}", label=arm)
    ax.set_xticks(range(len(fractions)), [f"{INPUT_LEN}->{round(f * INPUT_LEN)}" for f in fractions])
    ax.set(xlabel="input to latent tokens", ylabel="test token accuracy",
           title=f"The recipe against searches of {BUDGET_TRAININGS} recipe trainings' CPU-seconds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(data_path: str, workspace: Path) -> list[dict[str, Any]]:
    """Every arm at every fraction, in ``workspace`` (a rerun continues there); writes the table,
    each search's outcome and the figure to benchmarks/tables/."""
    workspace.mkdir(parents=True, exist_ok=True)
    _, runs = run_sweep(workspace, "recipe", _trained(data_path, RECIPE, list(FRACTIONS)))
    recipe = {f: _scores(workspace / "ws", "recipe", f, runs) for f in FRACTIONS}
    searches = [_searched(workspace, data_path, arm, fraction, 10 * i + s, recipe[fraction])
                for i, fraction in enumerate(FRACTIONS) for arm in ARMS for s in range(SEARCH_SEEDS)]
    rows = summarize(recipe, searches)
    TABLES.mkdir(exist_ok=True)
    pd.DataFrame(rows).to_csv(TABLES / "search-vs-recipe.csv", index=False)
    pd.DataFrame([{"arm": s.arm, "fraction": s.fraction, "sampler_seed": s.seed, "best_val": s.best_val,
                   "is_recipe": s.is_recipe, "trials": s.trials, "cpu_seconds": s.cpu_seconds, "config": _short(s.config),
                   **{f"test_seed_{t}": v for t, v in zip(TRAINING_SEEDS, s.scores.test)}} for s in searches]
                 ).to_csv(TABLES / "search-vs-recipe-searches.csv", index=False)
    figure(recipe, searches, TABLES / "search-vs-recipe.png")
    return rows
