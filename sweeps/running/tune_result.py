"""A trial's result as it crosses Ray Tune: an :class:`~seqae_core.epoch.EpochRecord` and where it
was trained, made a dict for ``tune.report`` by :func:`to_tune` on the trial's worker and read
back from the dict Tune hands the driver's searcher, stoppers and callbacks by :func:`of_tune`.
Tune's own schedulers read the dict (its ``epoch``, the objective's name) as Tune gives it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from seqae_core.borders import TuneResult
from seqae_core.epoch import EpochRecord

TRIAL, FINISHED = "trial", "finished"
NODE_KEYS = ("node_id", "node_ip", "hostname")  # node_id seqae's; Tune adds the others to every result
GPU_KEYS = ("gpu", "gpu_ids", "cuda_visible_devices")  # sweeps.running.trial.trial_device's


@dataclass(frozen=True)
class TrialResult:
    """A sweep trial's validation: its record, whether it was its last (trained to its last epoch,
    or out of patience), and the node and GPUs it trained on (``node``: ``node_id``, ``node_ip``,
    ``hostname``; ``gpu``: ``gpu``, ``gpu_ids``, ``cuda_visible_devices``, none without a GPU)."""

    trial: int
    record: EpochRecord
    finished: bool
    node: Mapping[str, str]
    gpu: Mapping[str, str]

    def __post_init__(self) -> None:
        if bad := sorted(set(self.node) - set(NODE_KEYS)) + sorted(set(self.gpu) - set(GPU_KEYS)):
            raise ValueError(f"trial {self.trial}'s result names {bad}: a node is {NODE_KEYS}, its GPUs {GPU_KEYS}")


def to_tune(result: TrialResult) -> TuneResult:
    """What a trial's worker hands ``tune.report``: the record's metrics by name (Tune's
    schedulers read the objective and ``epoch`` there), the trial's number, node and GPUs."""
    return {**result.record.as_dict(), TRIAL: result.trial, **result.node, **result.gpu, FINISHED: result.finished}


def of_tune(result: Mapping[str, Any]) -> TrialResult:
    """A result as Tune hands it to the driver (:func:`to_tune`'s, with Tune's own keys added)."""
    return TrialResult(
        int(result[TRIAL]),
        EpochRecord.of_dict(result),
        bool(result.get(FINISHED, False)),
        {k: str(result[k]) for k in NODE_KEYS if k in result},
        {k: str(result[k]) for k in GPU_KEYS if k in result},
    )
