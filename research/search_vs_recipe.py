"""``python -m research.search_vs_recipe``: does the search find better models than the paper's recipe, and than a
random search, for the same CPU-seconds? Scored on the test pages, which nothing selected on.

At 50%, 25% and 12.5% latent (32 -> 16, 8 and 4 tokens on the offline corpus), every arm is a real
``seqae sweep run`` on the same data, split and epochs:

    recipe     the paper's configuration (:data:`RECIPE`), trained from seeds 1-3
    recipe@k   the recipe at equal compute: trained from k = :data:`BUDGET_TRAININGS` seeds of its
               own (disjoint for each replicate) and the best by validation kept
    random     a random search over :data:`SPACE`, the recipe enqueued as its first trial
    tpe+asha   TPE as frontier.yaml pins it (start-up 2) and ASHA (grace 1, factor 2), the recipe
               enqueued first
    random+asha  random search with the same ASHA, the recipe enqueued first: the studies' default
               since neither the replays nor these sweeps found TPE ahead of random search; added
               after the first two arms were measured, its rows registered before it was

Each search runs from :data:`SEARCH_SEEDS` sampler seeds (10 at 25%, 3 elsewhere), different at
each fraction (every arm's searches share them), trains from seed 0, and holds a budget of
:data:`BUDGET_TRAININGS` recipe trainings in CPU-seconds (what the recipe arm measured at that
fraction): the sweep's own ``budget``, which ends it within about one epoch of it; what it spent
past it is counted in its CPU-seconds. Two questions, each scored on the test pages:

- Does the search find a better *configuration*? Its best trial by validation is trained again
  from seeds 1-3; the gain over the recipe is paired by training seed, averaged per search seed,
  and its interval is Student's t over the search seeds (the unit that was replicated), with the
  exact sign-flip test beside it (:mod:`research.intervals`); Holm adjusts the p-values over the
  fractions, and the simultaneous (Bonferroni) interval is printed beside the adjusted p.
- Does it return a better *model* than the recipe at equal compute? The search's best trial's own
  test score against recipe@k's kept model, replicate by replicate.

``python -m research.search_vs_recipe --gpu`` runs the same protocol as the :data:`GPU` profile: the 25% fraction at
the paper's 512 -> 128 tokens and widths (:data:`PAPER_RECIPE`, :data:`PAPER_SPACE`), each trial an
eighth of a GPU, eight at once, the budget in GPU-seconds; its files are ``search-vs-recipe-gpu*``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import optuna
import pandas as pd
import torch
from matplotlib.figure import Figure
from mlflow.entities import Run

from research import TABLES, command
from research import evidence_table as E
from research.intervals import Interval, holm, sign_flip_p, simultaneous_level, t_interval
from research.sweep_runs import run_sweep
from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.borders import Document
from seqae_errors import ConfigError

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FRACTIONS = (0.5, 0.25, 0.125)
INPUT_LEN = 32
EPOCHS = 5  # the paper's learning-rate decay, 1e-3 -> 1e-4 over 5 epochs, to its end
TRAINING_SEEDS = (1, 2, 3)
SEARCH_SEEDS = {0.5: 3, 0.25: 10, 0.125: 3}  # 10 at 25%: enough for a t interval to exclude 0 at the spread seen
BUDGET_TRAININGS = 6  # a search's budget: this many recipe trainings' CPU-seconds, its enqueued recipe included
EQUAL_COMPUTE_SEEDS = 101  # recipe@k's replicate r trains from seeds 101 + k*r ... 101 + k*r + k - 1
ARMS = ("random", "tpe+asha", "random+asha")
# Each pair of arms compared, paired by sampler seed and training seed: TPE against random search with
# and without the same scheduler, and what ASHA does for random search.
CONTRASTS = (("tpe+asha", "random"), ("tpe+asha", "random+asha"), ("random+asha", "random"))

RECIPE: E.Settings = {  # the paper's Table I at the laptop profiles' halved widths, with the residual they need
    "model.block": "paper",
    "model.d_model": 128,
    "model.d_attn": 256,
    "model.layers": 1,
    "model.reduction": "gradual",
    "model.dropout": 0.0,
    "train.lr": 1.0e-3,
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
PAPER_RECIPE: E.Settings = {
    **RECIPE,
    "model.d_model": 256,
    "model.d_attn": 512,
}  # the paper's Table I: embedding 256, attention 512
PAPER_SPACE = {
    **SPACE,
    "model.d_model": {"type": "categorical", "choices": [128, 256, 512]},
    "model.d_attn": {"type": "categorical", "choices": [256, 512, 1024]},
}


@dataclass(frozen=True)
class Profile:
    """What the search against the recipe trains on and pays with (the laptop or the GPU profile)."""

    name: str  # its name in messages
    input_len: int
    max_pages: int | None  # None: every page of the corpus
    recipe: E.Settings
    space: Document  # the sweep file's search section
    gpu: float  # each trial's share of a GPU; 0 on CPUs. The budget's currency follows: GPU- or CPU-seconds
    max_concurrent: int
    search_seeds: dict[float, int]
    tables: str  # the prefix of its files in research/tables/

    @property
    def unit(self) -> str:
        return "gpu" if self.gpu else "cpu"

    def latent(self, fraction: float) -> str:
        return f"{self.input_len}->{round(fraction * self.input_len)}"


LAPTOP = Profile("search", INPUT_LEN, 30, RECIPE, SPACE, 0.0, 2, SEARCH_SEEDS, "search-vs-recipe")
# The paper's length and widths on one GPU in eighths (bf16 under precision auto), on the 25% fraction
# alone: 512-token windows of every page, since the offline corpus has too few pages for one sample each.
# Eight at once: on an H200 a trial's fixed costs, not the GPU, set the pace (12-15 s a training at a
# quarter GPU), and eight 0.125-GPU trials gave 6.97x one trial's tokens/s (bench gpu).
GPU = Profile("search-gpu", 512, None, PAPER_RECIPE, PAPER_SPACE, 0.125, 8, {0.25: 2}, "search-vs-recipe-gpu")
ASHA = {"type": "asha", "grace_period": 1, "reduction_factor": 2}  # the quickstart's
SAMPLERS: dict[str, tuple[Document, Document]] = {  # as registered; TPE's as frontier.yaml pins it
    "random": ({"type": "random"}, {"type": "none"}),
    "tpe+asha": (
        {"type": "tpe", "n_startup_trials": 2, "multivariate": True, "group": True, "constant_liar": True},
        ASHA,
    ),
    "random+asha": ({"type": "random"}, ASHA),
}


def document(
    data_path: str, description: str, fixed: Mapping[str, str | int | float | bool], profile: Profile = LAPTOP
) -> Document:
    """A sweep of the benchmark's data, split and schedule, with ``fixed`` config keys set."""
    config: dict[str, Document] = {
        "data": {
            "path": data_path,
            "samples": "windows",
            "input_len": profile.input_len,
            "max_pages": profile.max_pages,
            "vocab": "corpus",
            "test_fraction": 0.1,
        },
        "model": {"residual": True, "d_ffn": 512},
        "train": {
            "epochs": EPOCHS,
            "patience": 5,
            "batch_size": 16,
            "lr_final": 1.0e-4,
            "lr_schedule": "linear",
            "lr_decay_epochs": 5,
            "precision": "auto",
        },
    }
    for key, value in fixed.items():
        section, name = key.split(".", 1)
        config[section][name] = value
    return {
        "description": description,
        "config": config,
        "objective": {"metric": M.VAL_TOKEN_ACCURACY, "mode": "max"},
        "resources": {"cpu": 1, "gpu": profile.gpu},
        "max_concurrent": profile.max_concurrent,
    }


def _trained(
    data_path: str, fixed: Mapping[str, str | int | float | bool], cells: list[tuple[float, int]], profile: Profile
) -> Document:
    """``fixed`` trained at each ``(fraction, training seed)`` of ``cells``."""
    doc = document(data_path, "a configuration trained from several seeds", fixed, profile)
    doc["grid"] = {"model.latent_fraction,train.seed": [list(cell) for cell in cells]}
    doc["trials"] = {"per_cell": 1}
    return doc


def _search(data_path: str, arm: str, fraction: float, seed: int, budget_seconds: float, profile: Profile) -> Document:
    doc = document(
        data_path,
        f"{arm} at {fraction:.1%} latent, sampler seed {seed}",
        {"model.latent_fraction": fraction, "train.seed": 0},
        profile,
    )
    sampler, scheduler = SAMPLERS[arm]
    doc.update(
        search=profile.space,
        start={"recipe": profile.recipe},
        trials={"total": 60},
        sampler={**sampler, "seed": seed},
        scheduler=scheduler,
        budget={f"{profile.unit}_hours": budget_seconds / 3600},
    )
    return doc


def _study(workspace: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{workspace / 'optuna.db'}")


@dataclass(frozen=True)
class Scores:
    """A configuration trained from each of ``seeds``: validation (kept epoch) and test, in seed order."""

    val: tuple[float, ...]
    test: tuple[float, ...]
    cost_seconds: float  # one training's, the seeds' mean, in the profile's currency (GPU-seconds on a GPU)
    seeds: tuple[int, ...] = TRAINING_SEEDS

    def kept(self) -> float:
        """The test accuracy of the training with the best validation accuracy: what k trainings return."""
        return self.test[max(range(len(self.val)), key=lambda i: self.val[i])]


def _scores(workspace: Path, name: str, fraction: float, runs: list[Run], seeds: tuple[int, ...]) -> Scores:
    trials = sorted(
        (
            t
            for t in _study(workspace, name).trials
            if t.params.get("model.latent_fraction", fraction) == fraction
            and t.value is not None
            and t.params["train.seed"] in seeds
        ),
        key=lambda t: t.params["train.seed"],
    )
    assert tuple(t.params["train.seed"] for t in trials) == seeds, [t.params for t in trials]
    numbers = {str(t.number) for t in trials}
    cost = [r.data.metrics[M.RESOURCE_SECONDS] for r in runs if r.data.tags[N.TRIAL] in numbers]
    return Scores(
        tuple(float(t.value) for t in trials),  # type: ignore[arg-type]
        tuple(float(t.user_attrs[N.TEST][M.TEST_TOKEN_ACCURACY]) for t in trials),
        statistics.fmean(cost),
        seeds,
    )


def equal_compute_seeds(replicate: int) -> tuple[int, ...]:
    """recipe@k's training seeds for ``replicate``: k of its own, disjoint from every other's."""
    first = EQUAL_COMPUTE_SEEDS + BUDGET_TRAININGS * replicate
    return tuple(range(first, first + BUDGET_TRAININGS))


@dataclass(frozen=True)
class Search:
    arm: str
    fraction: float
    seed: int
    best_val: float  # the best trial's validation accuracy, which chose it (training seed 0)
    returned_test: float  # the best trial's own model on test: what the search returns
    config: E.Params  # the best trial's searched keys
    is_recipe: bool
    trials: int
    cost_seconds: float  # spent by the whole search, past its budget included
    budget_seconds: float
    scores: Scores  # the best configuration trained again from the training seeds


def _searched(
    folder: Path, data_path: str, arm: str, fraction: float, seed: int, recipe: Scores, profile: Profile
) -> Search:
    name = f"{arm.replace('+', '-')}-{int(fraction * 1000)}-s{seed}"
    budget = BUDGET_TRAININGS * recipe.cost_seconds
    _, runs = run_sweep(folder, name, _search(data_path, arm, fraction, seed, budget, profile))
    best = _study(folder / "ws", name).best_trial
    is_recipe = best.user_attrs.get(N.START) == "recipe"
    config = {k: v for k, v in best.params.items() if k in profile.space}
    if is_recipe:
        scores = recipe
    else:
        retrain = f"{name}-best"
        _, reruns = run_sweep(
            folder, retrain, _trained(data_path, config, [(fraction, t) for t in TRAINING_SEEDS], profile)
        )
        scores = _scores(folder / "ws", retrain, fraction, reruns, TRAINING_SEEDS)
    spent = sum(r.data.metrics.get(M.RESOURCE_SECONDS, 0.0) for r in runs)
    return Search(
        arm,
        fraction,
        seed,
        float(best.value),  # type: ignore[arg-type]
        float(best.user_attrs[N.TEST][M.TEST_TOKEN_ACCURACY]),  # type: ignore[arg-type]
        config,
        is_recipe,
        len(runs),
        spent,
        budget,
        scores,
    )


def _short(config: Mapping[str, E.Level]) -> str:
    """``{"model.d_model": 128, "train.lr": 0.00123}`` -> ``d_model=128 lr=1.2e-03``."""
    return " ".join(
        f"{k.split('.', 1)[1]}={v:.1e}"
        if isinstance(v, float) and k == "train.lr"
        else f"{k.split('.', 1)[1]}={round(v, 3) if isinstance(v, float) else v}"
        for k, v in sorted(config.items())
    )


def _claims(rows: list[tuple[command.Row, np.ndarray]]) -> None:
    """Fill each row's interval and tests from its per-search-seed differences; Holm over the rows
    given (one family), and the family's simultaneous intervals."""
    adjusted = holm([sign_flip_p(d) for _, d in rows])
    level = simultaneous_level(len(rows))
    for (row, differences), p in zip(rows, adjusted):
        t, joint = t_interval(differences), t_interval(differences, level)
        row.update(
            {
                "gain_points": round(100 * t.estimate, 2),
                "gain_95ci_t": _bracket(t),
                "p_sign_flip": round(sign_flip_p(differences), 4),
                "p_holm": round(p, 4),
                f"gain_ci_{len(rows)}_claims": _bracket(joint),
                "search_seeds": len(differences),
            }
        )


def _bracket(interval: Interval) -> str:
    return f"[{100 * interval.low:+.2f}, {100 * interval.high:+.2f}]"


def _of(searches: list[Search], arm: str, fraction: float) -> list[Search]:
    """``arm``'s searches at ``fraction``, by sampler seed: how arms are paired."""
    return sorted((s for s in searches if s.arm == arm and s.fraction == fraction), key=lambda s: s.seed)


def summarize(
    recipe: dict[float, Scores], equal: dict[float, list[Scores]], searches: list[Search], profile: Profile = LAPTOP
) -> list[command.Row]:
    """A row per fraction and arm: test accuracy over every search seed and training seed, and
    per search arm the gain over the recipe, paired by training seed and averaged per search seed,
    with its t interval over search seeds, exact sign-flip p, Holm-adjusted p over the fractions
    and the fractions' simultaneous interval; wins, the validation-to-test drop, CPU-seconds
    against the budget and the chosen configurations. Then per fraction each pair of
    :data:`CONTRASTS` measured there (paired by sampler seed and training seed; Holm over the
    fractions, per pair), and each search's returned model against recipe@k's (replicate by
    replicate)."""
    rows: list[command.Row] = []
    unit = profile.unit
    fractions = sorted(recipe, reverse=True)
    for fraction in fractions:
        r = recipe[fraction]
        rows.append(
            {
                "latent": profile.latent(fraction),
                "arm": "recipe",
                "test_mean": round(statistics.fmean(r.test), 4),
                "test_sd": round(statistics.stdev(r.test), 4),
                "val_to_test_drop": round(statistics.fmean(r.val) - statistics.fmean(r.test), 4),
                f"{unit}_s": round(len(r.test) * r.cost_seconds),
                "chosen": "recipe",
            }
        )
        if equal.get(fraction):
            kept = [e.kept() for e in equal[fraction]]
            rows.append(
                {
                    "latent": profile.latent(fraction),
                    "arm": f"recipe@{BUDGET_TRAININGS}",
                    "test_mean": round(statistics.fmean(kept), 4),
                    "test_sd": round(statistics.stdev(kept), 4) if len(kept) > 1 else None,
                    f"{unit}_s": round(statistics.fmean(BUDGET_TRAININGS * e.cost_seconds for e in equal[fraction])),
                    "chosen": f"the best of {BUDGET_TRAININGS} recipe trainings by validation",
                }
            )
    for arm in ARMS:
        family: list[tuple[command.Row, np.ndarray]] = []
        for fraction in fractions:
            mine = _of(searches, arm, fraction)
            if not mine:
                continue
            tests = np.array([s.scores.test for s in mine])
            recipe_mean = statistics.fmean(recipe[fraction].test)
            row: command.Row = {
                "latent": profile.latent(fraction),
                "arm": arm,
                "test_mean": round(float(tests.mean()), 4),
                "test_sd": round(float(tests.std(ddof=1)), 4),
                "wins": f"{sum(float(np.mean(s.scores.test)) > recipe_mean for s in mine)}/{len(mine)}",
                "val_to_test_drop": round(
                    statistics.fmean(s.best_val - float(np.mean(s.scores.test)) for s in mine), 4
                ),
                f"{unit}_s": round(statistics.fmean(s.cost_seconds for s in mine)),
                f"budget_{unit}_s": round(statistics.fmean(s.budget_seconds for s in mine)),
                f"overshoot_{unit}_s_max": round(max(s.cost_seconds - s.budget_seconds for s in mine), 1),
                "trials": round(statistics.fmean(s.trials for s in mine), 1),
                "chosen": " | ".join("recipe" if s.is_recipe else _short(s.config) for s in mine),
            }
            family.append((row, (tests - np.array(recipe[fraction].test)).mean(axis=1)))
        _claims(family)
        rows += [row for row, _ in family]
    for first, second in CONTRASTS:
        contrasts: list[tuple[command.Row, np.ndarray]] = []
        for fraction in fractions:
            mine, theirs = _of(searches, first, fraction), _of(searches, second, fraction)
            if mine and [s.seed for s in mine] == [s.seed for s in theirs]:
                contrasts.append(
                    (
                        {"latent": profile.latent(fraction), "arm": f"{first} - {second}"},
                        (np.array([s.scores.test for s in mine]) - np.array([s.scores.test for s in theirs])).mean(
                            axis=1
                        ),
                    )
                )
        _claims(contrasts)
        rows += [row for row, _ in contrasts]
    for arm in ARMS:
        returned: list[tuple[command.Row, np.ndarray]] = []
        for fraction in fractions:
            mine = _of(searches, arm, fraction)
            kept = [e.kept() for e in equal.get(fraction, [])]
            if mine and len(kept) == len(mine):
                returned.append(
                    (
                        {
                            "latent": profile.latent(fraction),
                            "arm": f"{arm} - recipe@{BUDGET_TRAININGS} (returned model)",
                        },
                        np.array([s.returned_test for s in mine]) - np.array(kept),
                    )
                )
        _claims(returned)
        rows += [row for row, _ in returned]
    return rows


def _tests(recipe: dict[float, Scores], searches: list[Search], arm: str, fraction: float) -> list[float]:
    """Every test accuracy of ``arm`` at ``fraction``: each training seed of each search seed."""
    if arm == "recipe":
        return list(recipe[fraction].test)
    return [v for s in _of(searches, arm, fraction) for v in s.scores.test]


def figure(recipe: dict[float, Scores], searches: list[Search], path: Path, profile: Profile = LAPTOP) -> Path:
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
    ax.set_xticks(range(len(fractions)), [profile.latent(f) for f in fractions])
    ax.set(
        xlabel="input to latent tokens",
        ylabel="test token accuracy",
        title=f"The recipe against searches of {BUDGET_TRAININGS} recipe trainings' {profile.unit.upper()}-seconds",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def save_figure(fig: Figure, path: Path) -> Path:
    """``fig`` written to ``path`` at the report's resolution, then closed."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def outputs(fractions: tuple[float, ...], profile: Profile = LAPTOP) -> dict[str, Path]:
    """Where a run over ``fractions`` writes: ``search-vs-recipe*`` for every fraction, else with
    the fraction in the name (``-0250``), so that measuring one fraction keeps the others' files;
    the GPU profile's are ``search-vs-recipe-gpu*``."""
    tag = "" if set(fractions) == set(FRACTIONS) else "-" + "-".join(f"{round(f * 1000):04d}" for f in fractions)
    return {
        part: TABLES / f"{profile.tables}{tag}{suffix}"
        for part, suffix in (
            ("table", ".csv"),
            ("searches", "-searches.csv"),
            ("recipe", "-recipe.csv"),
            ("figure", ".png"),
        )
    }


def run(
    data_path: str, workspace: Path, fractions: tuple[float, ...] = FRACTIONS, profile: Profile = LAPTOP
) -> list[command.Row]:
    """Every arm at each of ``fractions``, in ``workspace`` (a rerun continues there; each fraction's
    sweeps are its own, so fractions can be measured one at a time); writes the table, each search's
    outcome, every recipe training and the figure to research/tables/ (:func:`outputs`)."""
    if not set(fractions) <= set(profile.search_seeds):
        raise ConfigError(
            f"--fraction {fractions[0]} is not one of {profile.name}'s latent fractions "
            f"({', '.join(str(f) for f in sorted(profile.search_seeds))})"
        )
    workspace.mkdir(parents=True, exist_ok=True)
    recipe: dict[float, Scores] = {}
    equal: dict[float, list[Scores]] = {}
    searches: list[Search] = []
    for i, fraction in enumerate(FRACTIONS):
        if fraction not in fractions:
            continue
        replicates = [equal_compute_seeds(r) for r in range(profile.search_seeds[fraction])]
        cells = [(fraction, t) for t in TRAINING_SEEDS] + [(fraction, t) for seeds in replicates for t in seeds]
        name = f"recipe-{round(fraction * 1000)}"
        _, runs = run_sweep(workspace, name, _trained(data_path, profile.recipe, cells, profile))
        recipe[fraction] = _scores(workspace / "ws", name, fraction, runs, TRAINING_SEEDS)
        equal[fraction] = [_scores(workspace / "ws", name, fraction, runs, seeds) for seeds in replicates]
        searches += [
            _searched(workspace, data_path, arm, fraction, 10 * i + s, recipe[fraction], profile)
            for s in range(profile.search_seeds[fraction])
            for arm in ARMS
        ]
    rows = summarize(recipe, equal, searches, profile)
    out = outputs(fractions, profile)
    TABLES.mkdir(exist_ok=True)
    pd.DataFrame(rows).to_csv(out["table"], index=False)
    pd.DataFrame(
        [
            {
                "arm": s.arm,
                "fraction": s.fraction,
                "sampler_seed": s.seed,
                "best_val": s.best_val,
                "returned_test": s.returned_test,
                "is_recipe": s.is_recipe,
                "trials": s.trials,
                f"{profile.unit}_seconds": s.cost_seconds,
                "budget_seconds": s.budget_seconds,
                "overshoot_seconds": s.cost_seconds - s.budget_seconds,
                "config": _short(s.config),
                **{f"test_seed_{t}": v for t, v in zip(TRAINING_SEEDS, s.scores.test)},
            }
            for s in searches
        ]
    ).to_csv(out["searches"], index=False)
    pd.DataFrame(
        [
            {
                "arm": arm,
                "fraction": f,
                "replicate": r,
                "seed": seed,
                "val": val,
                "test": test,
                f"{profile.unit}_seconds": scores.cost_seconds,
            }
            for f in recipe
            for arm, r, scores in [("recipe", None, recipe[f])]
            + [(f"recipe@{BUDGET_TRAININGS}", r, e) for r, e in enumerate(equal[f])]
            for seed, val, test in zip(scores.seeds, scores.val, scores.test)
        ]
    ).to_csv(out["recipe"], index=False)
    figure(recipe, searches, out["figure"], profile)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = command.parser("search_vs_recipe", __doc__, "data", "workspace")
    parser.add_argument(
        "--fraction",
        type=float,
        default=None,
        help="measure only this fraction (default: 0.5, 0.25 and 0.125; --gpu: 0.25)",
    )
    parser.add_argument("--gpu", action="store_true", help="the paper's scale on a GPU: 512 -> 128 tokens, its widths")
    args = parser.parse_args(argv)
    profile = GPU if args.gpu else LAPTOP
    fractions = (args.fraction,) if args.fraction else tuple(profile.search_seeds) if args.gpu else FRACTIONS
    if args.gpu and not torch.cuda.is_available():
        command.show([{"status": "skipped: no GPU on this machine"}], args.out)
        return
    command.show(
        command.in_workspace(args, lambda workspace: run(command.data(args), workspace, fractions, profile)), args.out
    )


if __name__ == "__main__":
    command.main(main)
