"""The report's page and :func:`build`, which writes the whole report of a sweep: the figures,
the claims' verdicts, the trials table and validation samples, filled into the Jinja2 templates in
``dashboards/templates`` (their HTML, CSS and sort script; this module passes them data)."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypedDict

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from mlflow.tracking import MlflowClient

from dashboards import claims
from dashboards.report.data import Trial, collect, load_curves, load_samples
from dashboards.report.figures import drawn, fig2, fig3, losses, seeds_figures, summary_figure
from dashboards.report.front import sweep_front
from dashboards.report.groups import grid_data, seed_spreads, test_points
from dashboards.report.optuna_plots import optuna_figures
from dashboards.report.story import Story, story
from seqae_core import metrics as M
from sweeps.results.trials import read_trials
from sweeps.stores.search import read_only
from sweeps.stores.workspace import SweepState

# Autoescape is on for the .html templates: every value is text, escaped where it is rendered.
TEMPLATES = Environment(
    loader=PackageLoader("dashboards"), autoescape=select_autoescape(["html"]), undefined=StrictUndefined
)


def embedded(path: Path, caption: str) -> dict[str, str]:
    """A figure embedded as base64 PNG data."""
    return {"caption": caption, "name": path.name, "data": base64.b64encode(path.read_bytes()).decode()}


def _varying(trials: list[Trial]) -> list[str]:
    keys = sorted({k for t in trials for k in t.params})
    return [k for k in keys if len({str(t.params.get(k)) for t in trials}) > 1]


def _short(value: Any) -> Any:
    return f"{value:.4g}" if isinstance(value, float) else value


class Row(TypedDict):
    """A row of the report's trials table, classed by its trial's state."""

    state: str
    cells: list[str]


class Table(TypedDict):
    head: list[str]
    rows: list[Row]


class Pair(TypedDict):
    original: list[str]
    tokens: list[tuple[str, str]]  # (reconstructed, original) token pairs


class SampleBlock(TypedDict):
    """A latent ratio's samples, as the template shows them."""

    heading: str
    pairs: list[Pair]


class ClaimRow(TypedDict):
    css: str  # the verdict, as the row's class
    cells: list[str]


def _table(trials: list[Trial]) -> Table:
    """The trials table: its column names and a row of cell texts per trial, classed by its state."""
    varying = _varying(trials)
    unit = trials[0].resource if trials else "cpu"
    tested = any(t.test is not None for t in trials)
    repeated = any(t.spread for t in trials)
    head = [
        "trial",
        "state",
        *varying,
        "best val accuracy (selected on)",
        *(["test accuracy (never selected on)"] if tested else []),
        *(["val accuracy per seed"] if repeated else []),
        "epochs",
        "stopped early",
        "duration (s)",
        f"cost ({unit}-s)",
        f"accuracy per {unit}-hour",
        "node",
    ]
    rows: list[Row] = []
    for t in trials:
        cells = [
            f"{t.number} ({t.start})" if t.start else t.number,
            t.state,
            *[_short(t.params.get(k, "")) for k in varying],
            "" if t.best is None else M.value_text(t.best, t.spread, M.VAL_TOKEN_ACCURACY),
            *(["" if t.test is None else M.value_text(t.test, t.spread, M.TEST_TOKEN_ACCURACY)] if tested else []),
            *([M.seeds_text(t.spread, M.VAL_TOKEN_ACCURACY)] if repeated else []),
            t.epochs,
            "yes" if t.stopped_early else "no",
            f"{t.duration:.1f}",
            "" if t.cost is None else f"{t.cost:.1f}",
            f"{3600 * t.best / t.cost:.1f}" if t.cost and t.best is not None else "",
            t.node,
        ]
        rows.append({"state": t.state, "cells": [str(c) for c in cells]})
    return {"head": head, "rows": rows}


def _samples(
    trials: list[Trial], load: Callable[[Trial], list[dict[str, list[str]]]], per_ratio: int = 2
) -> list[SampleBlock]:
    """Per latent ratio, the best trial's first samples: the original tokens and (reconstructed,
    original) token pairs, which the template highlights where they differ. ``load`` reads a
    trial's samples: only the trials shown are read."""
    by_ratio: dict[tuple[int, int], list[Trial]] = defaultdict(list)
    for t in trials:
        if (t.samples or t.samples_logged) and t.input_len:  # a run without its parameters cannot be placed
            by_ratio[(t.input_len, t.latent_len)].append(t)
    blocks: list[SampleBlock] = []
    for (input_len, latent), group in sorted(by_ratio.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        best = max(group, key=lambda t: t.best or 0.0)
        samples = load(best)
        if not samples:
            continue
        pairs: list[Pair] = [
            {"original": sample["original"], "tokens": list(zip(sample["reconstruction"], sample["original"]))}
            for sample in samples[:per_ratio]
        ]
        blocks.append(
            {
                "heading": f"{input_len} to {latent} tokens ({100 * latent / input_len:.0f}%), trial {best.number}",
                "pairs": pairs,
            }
        )
    return blocks


def _claims(verdicts: list[claims.Verdict]) -> list[ClaimRow]:
    """A row per claim, classed by its verdict (``not-reproduced``) for the row's colour."""
    return [{"css": v.verdict.replace(" ", "-"), "cells": [v.claim, v.text, v.measured, v.verdict]} for v in verdicts]


def template_digest() -> str:
    """The SHA-256 of the report's templates: the README's picture of a report records the digest
    it was taken with, and a test fails when the templates change without a new picture."""
    folder = Path(__file__).resolve().parents[1] / "templates"
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build(state: SweepState, out: Path, log_to_mlflow: bool = True) -> Path:
    """Write the report of sweep ``state`` into the folder ``out`` and log it to the parent run."""
    backends = state.backends
    if not state.mlflow_experiment_id:
        raise ValueError(f"sweep {state.name!r} has not started yet: it has no MLflow runs")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    client = MlflowClient(backends.mlflow_tracking_uri)
    notes: list[str] = []
    try:
        study = read_only(state.spec, backends.optuna_storage, state.study_name)
        records = {t.number: t for t in read_trials(state.spec, study, backends.storage)}
        notes += study.narrowing_notes()
    except Exception as exc:  # noqa: BLE001 - the study may be unreachable; the runs' figures stand
        records = {}
        notes.append(f"Test scores, costs and starting points are unavailable: the Optuna study cannot be read ({exc})")
    parent, trials = collect(backends.mlflow_tracking_uri, state.mlflow_experiment_id, records)
    load_curves(client, drawn(trials))
    figures: list[tuple[Path, str]] = []
    if (path := fig2(trials, out)) is not None:
        figures.append((path, "Validation token accuracy over epochs, one line per latent length"))
    path, fig3_points = fig3(trials, out)
    if path is not None:
        figures.append((path, "Best accuracy against the latent length as a percentage of the input"))
    figures += [(p, "Accuracy over seeds, per epoch") for p in seeds_figures(trials, out)]
    if (path := summary_figure(trials, out)) is not None:
        figures.append((path, f"All {len(trials)} trials: accuracy over epochs (percentiles) and against cost"))
    shown = drawn(trials)
    if (path := losses(shown, out)) is not None:
        figures.append(
            (
                path,
                "Train and validation loss per trial"
                if shown is trials
                else f"Train and validation loss of the {len(shown)} best trials (of {len(trials)})",
            )
        )
    try:
        paths, optuna_notes = optuna_figures(backends.optuna_storage, state.study_name, out)
        figures += [(p, p.stem.replace("_", " ")) for p in paths]
        notes += optuna_notes
    except Exception as exc:  # noqa: BLE001 - the study may be unreachable; the rest of the report stands
        notes.append(f"Optuna plots unavailable: {exc}")
    try:
        if (path := sweep_front(state, trials, out)) is not None:
            figures.append((path, "The front on test beside the published grid's, and its hypervolume against compute"))
    except Exception as exc:  # noqa: BLE001 - the study may be unreachable; the rest of the report stands
        notes.append(f"The front is unavailable: the Optuna study cannot be read ({exc})")
    (out / "fig3_points.json").write_text(json.dumps({str(k): v for k, v in fig3_points.items()}, indent=1))
    verdicts = claims.check(test_points(trials), seed_spreads(trials), claims.not_studied(state.spec))
    (out / "claims.json").write_text(json.dumps([v.__dict__ for v in verdicts], indent=1))
    tested = [v for v in verdicts if v.verdict != claims.NOT_TESTED]
    try:
        told: Story | None = story(backends.optuna_storage, state.study_name, state.spec, trials)
    except Exception as exc:  # noqa: BLE001 - the study may be unreachable; the rest of the report stands
        told = None
        notes.append(f"What the sweep found is unavailable: the Optuna study cannot be read ({exc})")

    counts = Counter(t.state for t in trials)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials yet"
    page = TEMPLATES.get_template("report.html").render(
        name=state.name,
        done=len(trials),
        total=state.total_trials,
        summary=summary,
        built=time.strftime("%Y-%m-%d %H:%M:%S"),
        experiment_id=str(state.mlflow_experiment_id),
        parent_run_id=parent.info.run_id if parent else "-",
        story=told,
        claims=_claims(tested),
        untested=", ".join(v.claim for v in verdicts if v.verdict == claims.NOT_TESTED),
        figures=[embedded(p, c) for p, c in figures],
        notes=notes,
        grid=grid_data(trials, state.spec.grid),
        trials=_table(trials),
        samples=_samples(trials, partial(load_samples, client)),
    )
    index = out / "index.html"
    index.write_text(page)
    if log_to_mlflow and parent is not None:
        client.log_artifacts(parent.info.run_id, str(out), artifact_path="report")
    return index
