"""The research measures real sweeps: `seqae sweep run` of a sweep document in a folder of its own,
then what the sweep tracked in MLflow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from seqae import api
from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.borders import Document


def ended(workspace: Path, name: str) -> bool:
    """Whether sweep ``name`` ended in an earlier run: every trial done, or stopped (its budget,
    its target) with none left to continue. Resumed, such a sweep would lift its stop and, where
    the budget's reserve for running trials has come free, start another trial: a benchmark read
    back would drift."""
    listed = next((s for s in api.sweeps(workspace) if s.name == name), None)  # `seqae sweep list`'s row
    return listed is not None and listed.outcome in ("complete", "stopped") and "RUNNING" not in listed.by_state


def run_sweep(folder: Path, name: str, doc: Document) -> tuple[MlflowClient, list[Run]]:
    """Run the sweep ``doc`` as ``name`` in ``folder`` (or continue it there, when an earlier run was
    interrupted; one that :func:`ended` is read back as it is); the MLflow client and its trials'
    runs. The driver's output is kept beside the sweep file (``<name>.log``): a failed trial's
    error line is there when the sweep went on."""
    file = folder / f"{name}.yaml"
    workspace = folder / "ws"
    if not ended(workspace, name):
        file.write_text(yaml.safe_dump(doc))
        run = subprocess.run(
            [sys.executable, "-m", "seqae", "sweep", "run", str(file), "--workspace", str(workspace), "--or-resume"],
            capture_output=True,
            text=True,
            env=os.environ.copy(),
            check=False,
        )
        (folder / f"{name}.log").write_text(run.stdout + run.stderr)
        if run.returncode != 0:
            raise RuntimeError(f"sweep {name} failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    client = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(name)
    assert experiment is not None, "the sweep created no MLflow experiment"
    return client, [r for r in client.search_runs([experiment.experiment_id]) if N.TRIAL in r.data.tags]


def sweep_events(folder: Path, name: str, doc: Document) -> list[tuple[float, int, int, float]]:
    """Run a sweep; its results as (logged at, trial, epoch, accuracy), in the order they arrived."""
    client, runs = run_sweep(folder, name, doc)
    events = []
    for r in runs:
        for m in client.get_metric_history(r.info.run_id, M.VAL_TOKEN_ACCURACY):
            events.append((m.timestamp, int(r.data.tags[N.TRIAL]), m.step, m.value))
    return sorted(events)


def per_epoch(client: MlflowClient, run: Run, metric: str) -> list[float]:
    """A trial's values of ``metric``, epoch by epoch."""
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, metric), key=lambda m: m.step)]
