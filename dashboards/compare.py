"""`seqae sweep compare A B [...]`: sweeps of one objective side by side (a fork beside its
origin, or sweeps of different studies), in the terminal and as a page in the report's style
(:mod:`dashboards.compare_page`), from each sweep's typed trial records (:func:`sweeps.results.export.trials`);
:meth:`seqae.api.Sweep.compare` calls it."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from dashboards.compare_page import Compared, build
from seqae_core import metrics as M
from seqae_core.records import RecordStore
from seqae_errors import ConfigError
from sweeps.results.export import trials
from sweeps.results.trials import Trial
from sweeps.running.progress import text_table
from sweeps.stores.workspace import Workspace


def _value(trial: Trial, metric: str) -> float | None:
    """The trial's ``metric`` at its kept epoch; None where it has none (or it is NaN)."""
    value = trial.metrics.get(metric)
    return value if value is not None and not math.isnan(value) else None


def _compared(workspace: Workspace, name: str, metric: str, sign: float) -> Compared:
    state = workspace.read(name)
    spec = state.spec
    records = trials(workspace, name)
    spent, best, points = 0.0, None, []
    for trial in sorted((t for t in records if t.ended), key=lambda t: t.ended):
        spent += trial.cost_seconds
        value = _value(trial, metric)
        if trial.state == "COMPLETE" and value is not None and (best is None or sign * value > sign * best):
            best = value
        if best is not None:
            points.append((spent, float(best)))
    scored = [(value, t) for t in records if t.state == "COMPLETE" and (value := _value(t, metric)) is not None]
    # the best, and the first trial of equal values
    top_value, top = max(scored, key=lambda s: (sign * s[0], -s[1].number)) if scored else (None, None)
    curve: list[tuple[float, float]] = []
    if top is not None:
        progress = RecordStore.of_trial(state.backends.storage, top.number).progress()
        curve = [(float(h[M.EPOCH]), float(h[M.VAL_TOKEN_ACCURACY])) for h in progress.history] if progress else []
    counts = Counter(t.state for t in records)
    test = _value(top, M.TEST_TOKEN_ACCURACY) if top is not None else None
    cells = {
        "sweep": name,
        "trials": f"{len(records)}: " + ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())),
        "best trial": "-" if top is None else f"{top.number}" + (f" ({top.start})" if top.start else ""),
        f"best {metric} (val)": "-" if top_value is None else f"{top_value:.4f}",
        "its test token accuracy": "-" if test is None else f"{test:.4f}",
        f"{spec.share[0]}-hours": f"{sum(t.cost_seconds for t in records) / 3600:.3f}",
        "forked from": state.forked_from or "-",
    }
    return Compared(name, cells, points, curve, spec.share[0])


def compare(workspace: Workspace, names: list[str], out: str | None = None) -> tuple[str, Path]:
    """The terminal table and the written page's path; refuses fewer than two sweeps, an unknown
    one, or sweeps whose first objectives differ, before writing anything."""
    if len(names) < 2:
        raise ConfigError(f"compare needs two sweeps or more, got {len(names)}")
    objectives = {}
    for name in names:
        state = workspace.read(name)
        objective = state.spec.objectives[0]
        objectives[name] = (objective.metric, objective.mode)
    if len(set(objectives.values())) > 1:
        raise ConfigError(
            "these sweeps optimize different objectives: "
            + ", ".join(f"{n}: {m} ({mode})" for n, (m, mode) in objectives.items())
        )
    metric, mode = objectives[names[0]]
    sweeps = [_compared(workspace, name, metric, 1.0 if mode == "max" else -1.0) for name in names]
    units = {s.unit for s in sweeps}
    if len(units) > 1:
        raise ConfigError(
            f"these sweeps pay in different currencies ({', '.join(sorted(units))}-hours); compare "
            "sweeps whose trials hold the same kind of resource"
        )
    head = list(sweeps[0].cells)
    text = text_table(head, [[s.cells[c] for c in head] for s in sweeps])
    page = build(sweeps, metric, Path(out) if out else workspace.root / "compare" / "-vs-".join(names))
    return text, page
