"""The machine's CPU, memory and GPU use while a trial trains, sampled on the worker and kept in
each epoch's record (the driver logs them with the epoch) under MLflow's system-metric names.

Read with the libraries MLflow's own monitors read (psutil; nvidia-ml-py for NVIDIA GPUs), the
same figures and names, but not through MLflow's monitor classes: importing ``mlflow`` would cost
each trial's worker CPU-seconds at its start (measured: docs/explanation/performance.md, "The
figures behind the code's choices"), and only the driver talks to MLflow."""

from __future__ import annotations

import os
import threading
from collections import defaultdict

import psutil
import pynvml

from seqae_core import metrics as M

# MLflow's setting for its monitors' sampling interval, honoured here too.
SAMPLING_INTERVAL = "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"


class SystemMetrics:
    """CPU and memory (the whole machine's, as MLflow reports them) and, where NVML finds NVIDIA
    GPUs, each GPU's memory, utilization and power. A background thread takes a sample every
    ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` seconds (default ``interval``); :meth:`epoch` takes
    one more and returns the means since its last call, rounded as MLflow rounds them, under
    MLflow's names (``system/cpu_utilization_percentage``, ``system/gpu_0_utilization_percentage``, ...)."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = float(os.environ.get(SAMPLING_INTERVAL) or interval)
        self.gpus = _gpu_handles()
        self._samples: dict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="seqae-system-metrics", daemon=True)

    def __enter__(self) -> SystemMetrics:
        psutil.cpu_percent()  # the first reading is 0 by definition: it starts psutil's count
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        memory = psutil.virtual_memory()
        taken = {
            "cpu_utilization_percentage": psutil.cpu_percent(),
            "system_memory_usage_megabytes": memory.used / 1e6,
            "system_memory_usage_percentage": memory.used / memory.total * 100,
        }
        for i, handle in enumerate(self.gpus):
            taken.update(_gpu_sample(i, handle))
        with self._lock:
            for name, value in taken.items():
                self._samples[name].append(value)

    def epoch(self) -> dict[str, float]:
        """The means of the samples since the last call (an epoch), the epoch's end included."""
        self.sample()
        with self._lock:
            means = {name: round(sum(values) / len(values), 1) for name, values in self._samples.items()}
            self._samples.clear()
        return {f"{M.SYSTEM_PREFIX}{name}": float(value) for name, value in means.items()}


def _gpu_handles() -> list[object]:
    """NVML's handle of each NVIDIA GPU; none where NVML cannot start (no driver, no GPU)."""
    try:
        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError:
        return []


def _gpu_sample(i: int, handle: object) -> dict[str, float]:
    """GPU ``i``'s readings that NVML gives (a GPU may not report its power, for one)."""
    taken: dict[str, float] = {}
    try:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        taken[f"gpu_{i}_memory_usage_percentage"] = memory.used / memory.total * 100
        taken[f"gpu_{i}_memory_usage_megabytes"] = memory.used / 1e6
    except pynvml.NVMLError:
        pass
    try:
        taken[f"gpu_{i}_utilization_percentage"] = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
    except pynvml.NVMLError:
        pass
    try:
        milliwatts = pynvml.nvmlDeviceGetPowerUsage(handle)
        taken[f"gpu_{i}_power_usage_watts"] = milliwatts / 1000
        taken[f"gpu_{i}_power_usage_percentage"] = milliwatts / pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) * 100
    except pynvml.NVMLError:
        pass
    return taken
