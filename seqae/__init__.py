"""seqae from Python: ``import seqae``, then ``seqae.Sweep.run(...)``, ``seqae.Sweep("name").status()``,
``seqae.plan(...)``: the names of :mod:`seqae.api`.

The package on top of the tree: its API over the sweep service (:mod:`sweeps`) and the report
(:mod:`dashboards`), and the ``seqae`` command line (:mod:`seqae.cli`) that calls it. Importing it
loads what opening a sweep needs and no PyTorch, Ray or MLflow: each method imports what it uses."""

from seqae.api import (
    Encoded,
    Encoding,
    Pending,
    Sweep,
    check_changes,
    encode,
    plan,
    queue,
    set_priority,
    set_quota,
    show_progress,
    sweeps,
    ui,
)

__all__ = [
    "Encoded",
    "Encoding",
    "Pending",
    "Sweep",
    "check_changes",
    "encode",
    "plan",
    "queue",
    "set_priority",
    "set_quota",
    "show_progress",
    "sweeps",
    "ui",
]
