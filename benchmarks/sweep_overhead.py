"""What the sweep layer costs: an 8-trial sweep on 2 CPUs, run through the real `seqae sweep run`,
against the trials' own training time divided by the parallelism.

    fixed start-up   command start -> first trial's run opened (Ray, data, Optuna, MLflow)
    fixed wind-down  last trial's run closed -> command exit (model registry, report)
    ideal            sum over trials of their epochs' own seconds / parallelism
    overhead         (wall - fixed start-up - fixed wind-down - ideal) / ideal
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TypedDict

from mlflow.tracking import MlflowClient

from seqae_core import metrics as M
from seqae_core import names as N


class Overhead(TypedDict):
    """The row of ``seqae bench overhead``: a small sweep's wall time against its trials' own."""

    trials: int
    parallel: int
    wall_s: float
    fixed_startup_s: float
    fixed_wind_down_s: float
    trial_own_s: float
    ideal_s: float
    overhead_pct: float
    trial_data_start_s_max: float
    cache_entries: int


STUDY = Path(__file__).resolve().parents[1] / "sweeps" / "studies" / "quickstart.yaml"


def run(data_path: str, trials: int = 8, parallel: int = 2, epochs: int = 3) -> list[Overhead]:
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "ws"
        sets = [
            f"data.path={data_path}",
            "data.samples=windows",
            "data.max_pages=30",
            "data.input_len=32",
            "model.latent_len=16",
            "model.d_model=64",
            "model.d_attn=64",
            "model.d_ffn=128",
            f"train.epochs={epochs}",
            "train.batch_size=32",
            f"trials.total={trials}",
            f"max_concurrent={parallel}",
            "resources.cpu=1",
            "scheduler.type=none",
        ]  # every trial its epochs
        start = time.time()
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "seqae",
                "sweep",
                "run",
                str(STUDY),
                "--name",
                "overhead",
                "--workspace",
                str(workspace),
                *[a for s in sets for a in ("--set", s)],
            ],
            capture_output=True,
            text=True,
            env=os.environ.copy(),
        )
        wall = time.time() - start
        if run.returncode != 0:
            raise RuntimeError(f"the benchmark sweep failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
        client = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("overhead")
        assert experiment is not None, "the sweep created no MLflow experiment"
        children = [r for r in client.search_runs([experiment.experiment_id]) if N.TRIAL in r.data.tags]
        own = [sum(m.value for m in client.get_metric_history(r.info.run_id, M.EPOCH_SECONDS)) for r in children]
        data_seconds = [r.data.metrics.get(M.DATA_SECONDS, float("nan")) for r in children]
        first_open = min(r.info.start_time for r in children) / 1000
        last_close = max(r.info.end_time for r in children) / 1000
        entries = [p for p in (workspace / "cache").iterdir() if p.is_dir() and not p.name.startswith(".")]
    startup, wind_down = first_open - start, start + wall - last_close
    ideal = sum(own) / parallel
    overhead = (wall - startup - wind_down - ideal) / ideal
    return [
        {
            "trials": len(children),
            "parallel": parallel,
            "wall_s": round(wall, 1),
            "fixed_startup_s": round(startup, 1),
            "fixed_wind_down_s": round(wind_down, 1),
            "trial_own_s": round(sum(own), 1),
            "ideal_s": round(ideal, 1),
            "overhead_pct": round(100 * overhead, 1),
            "trial_data_start_s_max": round(max(data_seconds), 3),
            "cache_entries": len(entries),
        }
    ]
