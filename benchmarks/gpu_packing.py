"""How many concurrent 128 -> 64 trials one GPU holds with fractional GPU resources, and their
aggregate training tokens/s against one trial alone. Needs a GPU; reports a skip without one.

:func:`trials_at_once_per_gpu` measures the packing from the trials' MLflow runs; the rehearsal
on logical GPUs (tests/test_logical_gpus.py) checks Ray's scheduling with it, without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from benchmarks.rows import Row
from seqae_core import metrics as M
from seqae_core import names as N

STUDY = Path(__file__).resolve().parents[1] / "sweeps" / "studies" / "quickstart.yaml"


def at_once(spans: Iterable[tuple[float, float]]) -> int:
    """The most ``(start, end)`` spans that overlap at one moment; one that ends as another starts
    does not overlap it: ``at_once([(0, 2), (1, 3), (2, 4)]) == 2``."""
    events = sorted(e for start, end in spans for e in ((start, 1), (end, -1)))  # at a tie, an end first
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def trials_at_once_per_gpu(runs: Iterable[Run]) -> dict[str, int]:
    """The most trials that ran at once on each GPU, ``{"127.0.0.3 GPU 0": 4}``, from a sweep's
    MLflow runs: the trials' runs, grouped by the node and the GPU ids each recorded (a trial that
    held several GPUs counts on each), each spanning its run's start and end. Those are the
    driver's times, when it heard each trial start and end, written in order by one writer: a
    trial's run ends before the run of a trial that takes its place starts, so a trial that only
    followed another on a GPU never counts as beside it. Runs still open are left out."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        tags = run.data.tags
        if N.TRIAL in tags and N.GPU_IDS in tags and run.info.end_time:
            for gpu in tags[N.GPU_IDS].split(","):
                spans.setdefault(f"{tags.get('ray.node_ip', '?')} GPU {gpu}", []).append(
                    (run.info.start_time, run.info.end_time)
                )
    return {gpu: at_once(found) for gpu, found in sorted(spans.items())}


def run(data_path: str, packings: tuple[int, ...] = (1, 2, 4, 8)) -> list[Row]:
    rows: list[Row] = []
    alone = None
    for k in packings:
        with tempfile.TemporaryDirectory() as tmp:
            workspace = Path(tmp) / "ws"
            sets = [
                f"data.path={data_path}",
                "data.samples=first",
                "data.input_len=128",
                "model.latent_len=64",
                "model.d_model=256",
                "model.d_attn=512",
                "model.heads=8",
                "train.epochs=2",
                f"trials.total={k}",
                f"max_concurrent={k}",
                f"resources.gpu={1 / k:.4f}",
                "resources.cpu=1",
                "search.model.d_model={type: categorical, choices: [256]}",
                "scheduler.type=none",
            ]
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "seqae",
                    "sweep",
                    "run",
                    str(STUDY),
                    "--name",
                    f"pack{k}",
                    "--workspace",
                    str(workspace),
                    *[a for s in sets for a in ("--set", s)],
                ],
                capture_output=True,
                text=True,
                env=os.environ.copy(),
            )
            if run.returncode != 0:
                rows.append({"trials_per_gpu": k, "status": "failed (out of memory?)", "tail": run.stdout[-300:]})
                break
            client = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
            experiment = client.get_experiment_by_name(f"pack{k}")
            assert experiment is not None, "the sweep created no MLflow experiment"
            runs = [r for r in client.search_runs([experiment.experiment_id]) if N.TRIAL in r.data.tags]
            total = sum(r.data.metrics[M.TOKENS_PER_S] for r in runs)
            alone = alone or total
            rows.append(
                {
                    "trials_per_gpu": k,
                    "gpu_per_trial": round(1 / k, 4),
                    "measured_at_once": max(trials_at_once_per_gpu(runs).values(), default=0),
                    "aggregate_tokens_per_s": round(total),
                    "vs_one_trial": round(total / alone, 2),
                    # each trial's own peak (torch's max_memory_allocated), summed: the packed GPU's need
                    "peak_gpu_mem_gib": round(sum(r.data.metrics.get(M.GPU_MEMORY_GIB, 0.0) for r in runs), 1),
                }
            )
    return rows
