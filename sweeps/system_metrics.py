"""The machine's CPU, memory and GPU use while a trial trains, sampled on the worker with
MLflow's own monitors and kept in each epoch's record (the driver logs them with the epoch)."""

from __future__ import annotations

import threading

from mlflow.environment_variables import MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL
from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor
from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

from seqae_core import metrics as M


class SystemMetrics:
    """MLflow's own system-metrics monitors (CPU and memory; NVIDIA GPUs where ``nvidia-ml-py``
    finds them), sampled on the machine that trains, as MLflow's ``SystemMetricsMonitor`` samples
    them, but kept rather than logged: only the driver talks to MLflow. A background thread takes a
    sample every ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` seconds (MLflow's setting; default
    ``interval``); :meth:`epoch` takes one more and returns the means since its last call under
    MLflow's names (``system/cpu_utilization_percentage``, ...), for the epoch's record. Like
    MLflow's, the CPU and memory figures are the whole machine's."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = float(MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL.get() or interval)
        self.monitors: list[BaseMetricsMonitor] = [CPUMonitor()]
        try:
            self.monitors.append(GPUMonitor())
        except (ImportError, RuntimeError):  # no nvidia-ml-py, or no NVIDIA GPU: no GPU metrics, as in MLflow
            pass
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="seqae-system-metrics", daemon=True)

    def __enter__(self) -> SystemMetrics:
        self.sample()  # psutil's first CPU reading is 0 by definition: it starts the count, and is dropped
        for monitor in self.monitors:
            monitor.clear_metrics()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        with self._lock:
            for monitor in self.monitors:
                monitor.collect_metrics()

    def epoch(self) -> dict[str, float]:
        """The means of the samples since the last call (an epoch), the epoch's end included."""
        self.sample()
        means: dict[str, float] = {}
        with self._lock:
            for monitor in self.monitors:
                means.update(monitor.aggregate_metrics())
                monitor.clear_metrics()
        return {f"{M.SYSTEM_PREFIX}{name}": float(value) for name, value in means.items()}
