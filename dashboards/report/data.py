"""A sweep's MLflow runs read into the report's :class:`Trial` records: each child run's
parameters (the whole configuration it trained), outcome and node, its curves (validation accuracy
for every trial, the others only for the trials drawn one by one) and its validation samples;
beside them, the trial as the sweep's stores hold it (:class:`sweeps.results.trials.Trial`: its
kept checkpoint's test scores, its cost, its starting point), read once for the whole report."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.config import parse_scalar
from sweeps.results import trials as stored
from sweeps.stores.mlflow_runs import all_runs

log = logging.getLogger(__name__)


# Optuna's trial states, as runs closed before the seqae.outcome tag recorded them
LEGACY_STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "interrupted"}
CURVES = (M.VAL_TOKEN_ACCURACY, M.TRAIN_LOSS, M.VAL_LOSS, M.TRAIN_LOSS_STEPS, M.GLOBAL_STEP)


@dataclass
class Trial:
    number: int
    run_id: str
    status: str  # the MLflow run's status
    state: str  # COMPLETE, PRUNED, FAIL or RUNNING
    params: dict[str, Any]
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    duration: float = 0.0
    node: str = ""
    samples: list[dict[str, list[str]]] = field(default_factory=list)
    resource: str = "cpu"
    record: stored.Trial | None = None  # the trial as the sweep's stores hold it; None for a run the study lacks
    # with train.repeats > 1: each seed's value and the standard error of the token accuracies, at the kept epoch
    spread: dict[str, float] = field(default_factory=dict)
    logged: set[str] = field(default_factory=lambda: set(CURVES))  # the metrics its run logged
    samples_logged: bool = False  # its run holds best-model artifacts (samples.json): load_samples reads them

    @property
    def test(self) -> float | None:
        """The kept checkpoint's test token accuracy (pages nothing selected on), not its run's
        last epoch's."""
        return self.record.metrics.get(M.TEST_TOKEN_ACCURACY) if self.record else None

    @property
    def cost(self) -> float | None:
        """Resource-seconds: training wall time x the CPUs or GPU fraction held."""
        return self.record.cost_seconds if self.record else None

    @property
    def start(self) -> str | None:
        """The starting point it is, by name."""
        return (self.record.start or None) if self.record else None

    @property
    def input_len(self) -> int:
        return int(self.params.get("data.input_len", 0))

    @property
    def latent_len(self) -> int:
        return int(self.params.get("model.latent_len", 0))

    @property
    def fraction(self) -> float:
        return self.latent_len / self.input_len if self.input_len else 0.0

    @property
    def accuracy(self) -> list[tuple[int, float]]:
        return self.curves.get(M.VAL_TOKEN_ACCURACY, [])

    @property
    def best(self) -> float | None:
        return max((v for _, v in self.accuracy), default=None)

    @property
    def kept_epoch(self) -> int | None:
        """The epoch early stopping kept: the first of the best validation accuracy."""
        return M.kept_epoch(self.accuracy)

    @property
    def epochs(self) -> int:
        return len(self.accuracy)

    @property
    def stopped_early(self) -> bool:
        """Stopped by the scheduler (pruned), or by early stopping before its last epoch."""
        return self.state == "pruned" or (
            self.state == "complete" and self.epochs < int(self.params.get("train.epochs", 0))
        )


def collect(
    tracking_uri: str, experiment_id: str, records: dict[int, stored.Trial] | None = None
) -> tuple[Any, list[Trial]]:
    """The parent run and every child run of a sweep, with their validation accuracy over epochs
    (the other curves: :func:`load_curves`, for the trials a figure draws one by one), each beside
    its trial's record in ``records`` (by number)."""
    records = records or {}
    client = MlflowClient(tracking_uri)
    found = list(all_runs(client, experiment_id))
    parent = next((r for r in found if r.data.tags.get(N.ROLE) == N.ROLE_SWEEP), None)
    trials = []
    now = time.time() * 1000
    for run in found:
        tags = run.data.tags
        if N.TRIAL not in tags:
            continue
        # set whenever the sweep closes the run (runs closed before the tag existed carry Optuna's state)
        state = tags.get(N.OUTCOME) or LEGACY_STATES.get(tags.get(N.OPTUNA_STATE, ""), "running")
        if run.info.status == "RUNNING":
            state = "running"
        trial = Trial(
            number=int(tags[N.TRIAL]),
            run_id=run.info.run_id,
            status=run.info.status,
            state=state,
            params={k: parse_scalar(v) for k, v in run.data.params.items()},
            duration=((run.info.end_time or now) - run.info.start_time) / 1000,
            node=tags.get(N.NODE_IP, "") + (f" ({tags[N.NODE_ID][:8]})" if N.NODE_ID in tags else ""),
            resource=tags.get(N.RESOURCE, "cpu"),
            record=records.get(int(tags[N.TRIAL])),
            logged=set(run.data.metrics),
            samples_logged=bool(tags.get(N.ARTIFACTS_EPOCH)),
        )
        load_curves(client, [trial], (M.VAL_TOKEN_ACCURACY,))
        for key in run.data.metrics:
            if M.is_spread(key) and M.base_metric(key) in (M.VAL_TOKEN_ACCURACY, M.TEST_TOKEN_ACCURACY):
                trial.spread[key] = next(
                    (m.value for m in client.get_metric_history(run.info.run_id, key) if m.step == trial.kept_epoch),
                    run.data.metrics[key],
                )
        trials.append(trial)
    return parent, sorted(trials, key=lambda t: t.number)


def load_curves(client: MlflowClient, trials: list[Trial], keys: tuple[str, ...] = CURVES) -> None:
    """Read the metric histories ``keys`` of ``trials`` that they logged and have not read yet: a
    call per trial and metric, so a large sweep's are read only for the trials drawn one by one."""
    for trial in trials:
        for key in keys:
            if key in trial.logged and key not in trial.curves:
                trial.curves[key] = sorted((m.step, m.value) for m in client.get_metric_history(trial.run_id, key))


def load_samples(client: MlflowClient, trial: Trial) -> list[dict[str, list[str]]]:
    """The validation samples the trial's best-model artifacts hold (empty if they are missing)."""
    if not trial.samples and trial.samples_logged:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                trial.samples = json.loads(
                    Path(client.download_artifacts(trial.run_id, "samples.json", tmp)).read_text()
                )
            except Exception:  # noqa: BLE001 - a missing artifact only drops the samples
                log.warning("no samples for trial %d", trial.number)
    return trial.samples
