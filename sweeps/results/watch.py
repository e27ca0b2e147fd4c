"""A live view of a sweep (:meth:`seqae.api.Sweep.watch`): in a Jupyter notebook one table that
updates in place, in a terminal or a plain Python session a line each time the sweep changes and
its table when it ends.

The notebook's table is one IPython display, updated through its display id
(``display(..., display_id=True)`` then ``handle.update(...)``): every Jupyter front end
(JupyterLab, Notebook, VS Code) and ``nbclient`` redraw that one output, so the view needs no
widget library and nothing that a Jupyter kernel does not already have. It reads the
sweep's Optuna study alone (never MLflow), so it may poll a sweep of the workspace whose driver
runs in another process, a terminal's `seqae sweep run` say, or a sweep submitted to a cluster,
whose state lives in the cluster's workspace: that one is read through the stores its submission
named, beside its Ray job's state (:func:`submitted`), and shows a waiting line until its driver
creates its study.
"""

from __future__ import annotations

import html
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from sweeps.results.remote_status import submitted_sweep
from sweeps.running import progress
from sweeps.running.submit import job_info
from sweeps.spec import sweep as spec_lib
from sweeps.stores.search import SweepStudy, read_only, study_exists
from sweeps.stores.workspace import Submission, Workspace

UNFINISHED = (TrialState.RUNNING, TrialState.WAITING)
JOB_ENDED = ("SUCCEEDED", "STOPPED", "FAILED")  # Ray's terminal JobStatus values


@dataclass(frozen=True)
class Look:
    """What one look at a sweep reads besides its trials: where its study is and what its driver
    is doing, from its state in a workspace or, submitted to a cluster, from its submission and job."""

    spec: spec_lib.SweepSpec
    optuna_storage: str
    study_name: str
    total_trials: int
    outcome: str  # what the heading says of its driver: its last session's outcome, or "job RUNNING"
    driver: str  # "not started" (it may yet start), "running" or "ended"


def local(workspace: Workspace, name: str) -> Callable[[], Look]:
    """Looks at sweep ``name`` of ``workspace``, whose driver keeps its state there."""
    workspace.read(name)  # an unknown name is refused before the first look

    def look() -> Look:
        state = workspace.read(name)
        outcome = state.sessions[-1].outcome if state.sessions else "not started"
        driver = outcome if outcome in ("not started", "running") else "ended"
        return Look(state.spec, state.backends.optuna_storage, state.study_name, state.total_trials, outcome, driver)

    return look


def submitted(record: Submission) -> Callable[[], Look]:
    """Looks at a sweep submitted to a cluster from this workspace, whose state lives in the
    cluster's: its study read from the stores its submission named, its driver's state from its job."""
    spec, backends = submitted_sweep(record)
    url = backends.optuna_storage

    def look() -> Look:
        status = job_info(record).status
        driver = "ended" if status in JOB_ENDED else "not started" if status == "PENDING" else "running"
        return Look(spec, url, record.name, spec.planned_trials(), f"job {status}", driver)

    return look


@dataclass(frozen=True)
class View:
    """What the live view shows at one moment."""

    heading: str  # sweep NAME: its outcome, trials by state, the best so far
    header: list[str]
    rows: list[list[str]]  # every trial, best first (sweeps.running.progress.summary_rows)
    notes: list[str]  # status's notes (a narrowed space, the trials outside it, ...)
    ended: bool  # its driver is not running and no trial is left running

    def text(self) -> str:
        return "\n".join([self.heading, self.table()])

    def table(self) -> str:
        """Every trial and the notes, as plain text."""
        return "\n".join([progress.text_table(self.header, self.rows), *self.notes])

    def html(self) -> str:
        """One HTML table, as a notebook shows it."""
        cells = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self.rows
        )
        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in self.header)
        notes = "".join(f"<div><small>{html.escape(n)}</small></div>" for n in self.notes)
        return (
            f"<div class='seqae-watch'><b>{html.escape(self.heading)}</b>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>{notes}</div>"
        )


def view(name: str, now: Look) -> View:
    """Sweep ``name`` as ``now`` finds it: its status line and a row per trial, from one read of its
    study (so the line and the rows agree); before its driver created the study, a waiting line."""
    spec = now.spec
    clock = time.strftime("%H:%M:%S")
    if not study_exists(now.optuna_storage, now.study_name):
        waiting = "its driver has not created its study yet"
        ended = now.driver == "ended"
        heading = (
            f"sweep {name}: {now.outcome}, {now.total_trials} trials; {'no study' if ended else waiting}; at {clock}"
        )
        return View(heading, [], [], [], ended)
    study = read_only(spec, now.optuna_storage, now.study_name)
    trials = settled(study)
    header, rows = progress.summary_rows(trials, spec.objectives, spec.values_of)
    by_state = Counter(t.state.name for t in trials)
    by_state["NOT_STARTED"] = now.total_trials - len(trials)
    best = study.best(trials)
    shown_best = (
        f"best: trial {best[0].number}  "
        + ", ".join(f"{o.metric} {v:.4f}" for o, v in zip(spec.objectives, best[0].values))
        if len(best) == 1
        else f"{len(best)} trials on the Pareto front"
        if best
        else "no trial completed"
    )
    unfinished = any(t.state in UNFINISHED for t in trials)
    ended = now.driver != "running" and not unfinished and (bool(trials) or now.driver == "ended")
    states = ", ".join(f"{k} {v}" for k, v in sorted(by_state.items()) if v > 0)
    heading = f"sweep {name}: {now.outcome}, {now.total_trials} trials ({states}); {shown_best}; at {clock}"
    return View(heading, header, rows, study.narrowing_notes(), ended)


def settled(study: SweepStudy, tries: int = 5) -> list[FrozenTrial]:
    """The study's trials once two reads in a row agree. Optuna reads a study's trials in several
    queries (the trials, then their values, attributes, ...), which a driver's write between them
    tears on SQLite, which reads each query's own snapshot: a trial still RUNNING with its value,
    a view that never was, printed as a change."""
    trials = study.trials()
    for _ in range(tries):
        again = study.trials()
        if again == trials:
            break
        trials = again
    return trials


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (IPython with a kernel), where displays update in place."""
    try:
        from IPython import get_ipython
    except ImportError:  # a plain Python: no IPython installed
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def watch(
    look: Callable[[], Look],
    name: str,
    every: float = 5.0,
    timeout: float | None = None,
    show: Callable[[View], None] | None = None,
) -> View:
    """Show sweep ``name`` every ``every`` seconds until it ends (or ``timeout`` seconds passed):
    in a notebook one table updated in place, elsewhere a line when it changed and the table at
    the end (``show``: another way to show each view). Returns the last view."""
    shown = show or (_notebook() if in_notebook() else _terminal())
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        now = view(name, look())
        shown(now)
        if now.ended or (deadline is not None and time.monotonic() >= deadline):
            if show is None and not in_notebook():
                print(now.table())  # below its heading, printed when it last changed
            return now
        time.sleep(every)


def _notebook() -> Callable[[View], None]:
    from IPython.display import HTML, display

    handle: list[Any] = []

    def show(now: View) -> None:
        if handle:
            handle[0].update(HTML(now.html()))
        else:
            handle.append(display(HTML(now.html()), display_id=True))

    return show


def _terminal() -> Callable[[View], None]:
    last: list[tuple[str, list[list[str]]]] = []

    def show(now: View) -> None:
        # the heading's clock aside: a line only when the trials changed
        key = (now.heading.rsplit("; at ", 1)[0], now.rows)
        if not last or last[0] != key:
            print(now.heading, flush=True)
            last[:] = [key]

    return show
