"""A driver's start on a finished sweep, up to its first new trial, timed: lock, sweep record,
Optuna study, MLflow experiment and run, reconcile, the new trial asked of the study. Data
preparation and Ray's start are left out: neither depends on the sweep's size.

Run as a script, ``python benchmarks/driver_start.py ROOT NAME [--freeze]``, by
``seqae bench control-plane`` in a process of its own, with whichever seqae is first on the path
(this checkout's, or the one ``--before`` names): it imports nothing but the driver's own modules,
whose calls here are the same before and after the control plane's fixes. ``--freeze``: freeze
the imports' objects out of the garbage collector first, as the driver's verbs do since those
fixes (``seqae.cli.commands._freeze_imported``). Prints the seconds the start took, as JSON."""

from __future__ import annotations

import gc
import json
import sys
import time

from sweeps.running.lifecycle import load_spec
from sweeps.stores import ledger
from sweeps.stores.search import open_study
from sweeps.stores.tracking import Tracker
from sweeps.stores.workspace import DriverLock, Workspace


def start(root: str, name: str) -> float:
    """The seconds from the lock to the first new trial."""
    started = time.perf_counter()
    workspace = Workspace(root)
    with DriverLock(workspace.sweep_dir(name) / "driver.lock"):
        state = workspace.read(name)
        spec = load_spec(state, check_file=False)
        backends = state.backends
        study = open_study(spec, backends.optuna_storage, state.study_name, state.total_trials, state.fingerprint)
        tracker = Tracker(backends.mlflow_tracking_uri, name, backends.storage, workspace.artifact_root, spec.share)
        tracker.open(state.fingerprint, state.mlflow_experiment_id, state.mlflow_parent_run_id, {})
        ledger.reconcile_study(study, backends.storage)
        ledger.reconcile_runs(study, tracker)
        trial = study.next_trial()
    if trial is None:
        raise SystemExit(f"sweep {name} in {root} has no trial left to start")
    return time.perf_counter() - started


if __name__ == "__main__":
    if "--freeze" in sys.argv[3:]:
        gc.freeze()
    print(json.dumps({"start_s": start(sys.argv[1], sys.argv[2])}))
