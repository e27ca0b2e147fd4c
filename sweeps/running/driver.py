"""A sweep's driver: open -> reconcile -> run -> close, under the sweep's lock.

A sweep's durable state is its Optuna study (which trials exist and how they
ended), its trials' checkpoint stores (how far each trial got, with its metric history) and its
MLflow runs (found by tags). A driver that starts, for a new sweep or an interrupted one, first
reconciles MLflow with the study and the checkpoints, then runs the trials that are left.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
from optuna.trial import FrozenTrial

from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.config import Flat
from seqae_core.device import describe_precision
from seqae_errors import ConfigError, StorageUnreachable
from sweeps.running import progress, provenance, runner, stoppers
from sweeps.running.lifecycle import Checked, load_spec
from sweeps.running.notify import Notifier, resolve
from sweeps.running.ray_connection import Cluster, check_resources, cluster_totals, join
from sweeps.running.slots import Slots
from sweeps.running.sweep_data import prepare_data, published_data
from sweeps.running.trial import LOGICAL_GPUS
from sweeps.spec import sweep as spec_lib
from sweeps.spec.sections import EVENTS, Objective
from sweeps.spec.sweep import cell_configs
from sweeps.stores import ledger, ownership
from sweeps.stores.mlflow_access import check_credentials, unreachable, waiting_for_mlflow
from sweeps.stores.queue import Queue
from sweeps.stores.search import SweepStudy, open_study
from sweeps.stores.shares import Capacity
from sweeps.stores.study_storage import PatientStorage, storage_lost
from sweeps.stores.tracking import Tracker
from sweeps.stores.workspace import Backends, DriverLock, SessionRecord, SweepState, Workspace
from sweeps.stores.writer import Writer

log = logging.getLogger(__name__)

EXIT_OK, EXIT_INTERRUPTED = 0, 130
MLFLOW_DRAIN_SECONDS = float(os.environ.get("SEQAE_MLFLOW_DRAIN_SECONDS", "300"))
# What a driver calls as each session ends: write sweep ``state``'s report into the folder, return its
# page. The report sits above the sweep service (it reads the sweep's records), so the caller hands it in.
Report = Callable[[SweepState, Path], Path]


@dataclass
class Session:
    """What one driver holds while it runs a sweep."""

    state: SweepState
    spec: spec_lib.SweepSpec
    backends: Backends
    study: SweepStudy
    tracker: Tracker
    epochs: int  # the most any trial may run
    data_seconds: float
    published: dict[Any, str]  # the data entries published for the trials' nodes (none: they read the driver's cache)
    record: SessionRecord  # this session's entry in sweep.json
    notifier: Notifier
    cluster: Cluster | None = None  # the Ray cluster it joined, once it joined one (ray_connection.join)
    slots: Slots | None = None  # its seat in the cluster's queue, once its trials run


def drive(
    workspace: Workspace,
    name: str,
    *,
    report: Report | None,
    check_file: bool = True,
    verbose: bool = False,
    extending: bool = False,
    allow_code_change: bool = False,
    checked: Checked | None = None,
) -> int:
    """Run what is left of a sweep: open its stores, reconcile them, run the trials, close the books
    and write its ``report`` (None: none). ``extending`` (`seqae sweep extend --epochs`) keeps a
    stopped sweep stopped: only the trials it reopened run. ``checked``: what creating the sweep
    in this process just checked (:func:`sweeps.running.lifecycle.create`), not checked again."""
    workspace.known(name)  # an unknown sweep is refused before anything is written
    workspace.check_writable()
    # `ray job stop` and service managers send SIGTERM: stop as gracefully as on Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    with DriverLock(workspace.sweep_dir(name) / "driver.lock"):
        session: Session | None = None
        writer: Writer | None = None
        try:
            session = open_session(workspace, name, check_file, allow_code_change, checked)
            writer = Writer(unreachable, session.tracker.note_outage)
            notes = ledger.reconcile_study(session.study, session.backends.storage, not extending)
            notes += waiting_for_mlflow(
                session.backends.mlflow_tracking_uri,
                "reconciling the trials' runs",
                partial(ledger.reconcile_runs, session.study, session.tracker),
            )
            for note in notes:
                progress.say(f"seqae: {note}")
            run(workspace, session, writer, verbose)
            left = close(workspace, session, writer, report)
        except Exception as exc:  # Tune hands a searcher's error on wrapped: the storage's is found in the chain
            lost = storage_lost(exc)
            if lost is None:
                raise
            if session is not None and writer is not None:
                abandon(workspace, session, writer, lost)
            raise StorageUnreachable(
                f"{lost}; once it answers, continue the sweep with `seqae sweep resume {name}`"
            ) from None
    outcome = session.record.outcome
    progress.say(f"seqae: sweep {name}: {outcome}; trials by state: {session.record.trials}")
    if left:
        progress.say(
            f"seqae: warning: MLflow did not take {left} writes before the sweep ended; the data is safe in the "
            f"trials' checkpoints and `seqae sweep resume {name}` delivers it"
        )
    if outcome != "complete":
        progress.say(f"seqae: {how_to_go_on(session, outcome)}")
    return EXIT_OK if outcome in ("complete", "stopped") and not session.record.interrupted else EXIT_INTERRUPTED


def how_to_go_on(session: Session, outcome: str) -> str:
    """What continues a sweep that ended before its last trial: a resume, unless its budget ended it
    with no trial left to continue (a resume would start none)."""
    name, spec = session.state.name, session.spec
    if (
        outcome == "stopped"
        and spec.budget
        and "RUNNING" not in (session.record.trials or {})
        and stoppers.budget_spent(spec, session.study, session.backends.storage)
    ):
        return (
            f"its budget is spent, so resuming starts no trial; go on in a fork with a larger one: "
            f"`seqae sweep fork {name} --file FILE --name NEW --set budget.{spec.budget.unit}_hours=H`"
        )
    return f"continue it with `seqae sweep resume {name}`"


def open_session(
    workspace: Workspace, name: str, check_file: bool, allow_code_change: bool = False, checked: Checked | None = None
) -> Session:
    """The sweep's record (read once, under the sweep's lock), its data (prepared once), its Optuna
    study and its MLflow runs. Refused when the code changed since the sweep's last session, unless
    ``allow_code_change``. What ``checked`` holds was checked in this process and is not again."""
    state = workspace.read(name)
    user = ownership.check(name, state.owner, "drive")  # its owner, or an admin, who is told whose sweep it drives
    if user != ownership.actor():
        progress.say(f"seqae: {user} drives it")
    checked = checked or Checked(name)
    spec = load_spec(state, check_file, current=checked.spec)
    code, change = check_code(state, allow_code_change)
    backends = state.backends
    if checked.mlflow != backends.mlflow_tracking_uri:
        check_credentials(backends.mlflow_tracking_uri)  # before the data is prepared, which may take minutes
    cluster = checked.cluster
    if cluster is None and os.environ.get("RAY_ADDRESS"):
        cluster = join(workspace.root, backends)
    started = time.time()
    epochs, entries, published = prepare_data(
        spec, str(workspace.cache_dir), published_data(workspace, backends.storage)
    )
    data_seconds = time.time() - started
    study = open_study(spec, backends.optuna_storage, state.study_name, state.total_trials, state.fingerprint)
    if state.owner:
        study.claim(state.owner)
    if change:
        study.set_control(code_change=change)
    state.code = {"commit": code.commit, "files": code.files}
    tracker = Tracker(
        backends.mlflow_tracking_uri,
        name,
        backends.storage,
        workspace.artifact_root if backends.mlflow_tracking_uri.startswith("sqlite:") else None,
        spec.share,
        entries,
        code.run_tags(state.file),
        code.diff,
        state.owner,
    )
    objective = spec.objectives[0]
    waiting_for_mlflow(
        backends.mlflow_tracking_uri,
        "opening the sweep's experiment",
        partial(
            tracker.open,
            state.fingerprint,
            state.mlflow_experiment_id,
            state.mlflow_parent_run_id,
            sweep_params(spec, state),
            (objective.metric, objective.mode),
        ),
    )
    state.mlflow_experiment_id, state.mlflow_parent_run_id = tracker.experiment_id, tracker.parent_run_id
    record = SessionRecord(
        started=started,
        pid=os.getpid(),
        user=ownership.actor(),
        host=socket.gethostname(),
        job=os.environ.get("RAY_JOB_ID"),
    )
    notifier = Notifier(
        name, resolve(list(spec.notify.urls) if spec.notify else []), spec.notify.events if spec.notify else EVENTS
    )
    return Session(state, spec, backends, study, tracker, epochs, data_seconds, published, record, notifier, cluster)


def check_code(state: SweepState, allow_code_change: bool) -> tuple[provenance.Code, str | None]:
    """The code this session runs, and what changed since the sweep's last session (``3 files:
    a.py, b.py, c.py; commit 1a2b3c4 -> 5d6e7f8``; None: nothing). A change is refused, naming
    the files, unless ``allow_code_change``: the sweep's trials so far ran the old code."""
    code, before = provenance.current(), state.code or {}
    files = provenance.changed(before["files"], code.files) if before else []
    if not files:
        return code, None
    commits = (before.get("commit"), code.commit)
    change = (
        f"{len(files)} file{'s' if len(files) > 1 else ''}: {', '.join(files[:8])}{', ...' if len(files) > 8 else ''}"
        + (f"; commit {(commits[0] or 'none')[:7]} -> {(commits[1] or 'none')[:7]}" if commits[0] != commits[1] else "")
    )
    if not allow_code_change:
        raise ConfigError(
            f"sweep {state.name!r}: its code changed since its last session ({change}); its trials so "
            f"far ran the old code. Go on with `seqae sweep resume {state.name} --allow-code-change` (the "
            "study's log records it; a submitted sweep's, run where it was submitted from, submits a job "
            "that goes on), or run the new code as a new sweep"
        )
    return code, change


def run(workspace: Workspace, session: Session, writer: Writer, verbose: bool) -> None:
    """Run the trials the study still has to run, handing MLflow's writes to ``writer``."""
    state, spec, study = session.state, session.spec, session.study
    state.sessions.append(session.record)
    workspace.write(state)
    todo = study.remaining()
    progress.say(
        f"seqae: sweep {state.name}{f' (profile {spec.profile})' if spec.profile else ''}: "
        f"{state.total_trials} trials planned, {todo} to run "
        f"(data ready in {session.data_seconds:.1f} s; training in {training_precision(spec)})"
    )
    if spec.resources.gpu and os.environ.get(LOGICAL_GPUS) == "1":
        progress.say(
            f"seqae: {LOGICAL_GPUS}=1: a trial that Ray gives a GPU on a node without CUDA trains on the "
            "CPU and says so (a rehearsal of GPU scheduling)"
        )
    session.record.interrupted = False
    if todo:
        session.cluster = session.cluster or join(workspace.root, session.backends)  # a local Ray starts here
        check_resources(spec, session.cluster.cpus, session.cluster.gpus)
        session.slots = Slots(
            Queue(session.backends.optuna_storage),
            state.study_name,
            state.owner or ownership.actor(),
            spec.priority or 0,
            study.control().max_concurrent or spec.max_concurrent,
            spec.resources.cpu,
            spec.resources.gpu,
            state.total_trials,
            state.total_trials - todo,
            Capacity(*cluster_totals()),
            spec.weight or 1.0,
        )
        try:
            runner.run_session(
                spec,
                study,
                session.tracker,
                writer,
                storage=session.backends.storage,
                cache_dir=str(workspace.cache_dir),
                published=session.published,
                session=len(state.sessions),
                epochs=session.epochs,
                verbose=verbose,
                notifier=session.notifier,
                slots=session.slots,
            )
        except KeyboardInterrupt:
            session.record.interrupted = True
        progress.say(f"\n{progress.summary(study.trials(), spec.objectives, spec.values_of)}\n")
        progress.say(f"seqae: {progress.best_line(study.best(), spec.objectives)}")
        progress.say("seqae: trials proposed by: " + ", ".join(f"{k} {v}" for k, v in study.proposals().items()))


def close(workspace: Workspace, session: Session, writer: Writer, report: Report | None) -> int:
    """Pause the trials left unfinished; once the sweep has ended (every trial done, or drained by
    its target, its budget or `seqae sweep stop` with none left running) register the best model
    and finish its run, else leave the run KILLED for the next session; let MLflow take the
    writes, record the session and rebuild the report with ``report``. Returns the writes MLflow
    did not take in time (they are safe in the checkpoints; the next session delivers them)."""
    study, tracker, name = session.study, session.tracker, session.state.name
    control, interrupted = study.control(), study.numbers(ledger.Outcome.RUNNING.optuna_state)
    complete = study.remaining() == 0
    outcome = "complete" if complete else "stopped" if control.drain else "interrupted"
    ended = "complete" if complete else None if interrupted else control.drain
    for number in interrupted:  # continued by the next session
        writer.submit(f"pausing trial {number}", partial(tracker.trial_ended, number, ledger.Outcome.RUNNING))
    if ended:
        writer.submit("registering the best model", lambda: register_best(study, tracker, name))
    writer.submit(
        "closing the sweep run",
        lambda: tracker.finish_parent("FINISHED" if ended else "KILLED", ended or "interrupted"),
    )
    if session.slots:
        session.slots.leave(outcome, session.state.total_trials - study.remaining())
    left = writer.close(MLFLOW_DRAIN_SECONDS)
    ended_session(session.record, outcome, writer, left, optuna_outages(study))
    session.record.control, session.record.trials = control.record(), study.counts()
    workspace.write(session.state)
    if report is not None and not left:
        rebuild_report(session.state, workspace, report)
    session.notifier.send(
        "end",
        f"the sweep is {outcome}",
        f"{progress.best_line(study.best(), study.spec.objectives)}; trials by state: {session.record.trials}",
    )
    session.notifier.close()
    return int(left)


def abandon(workspace: Workspace, session: Session, writer: Writer, lost: StorageUnreachable) -> None:
    """End a session whose study's database stayed away past the limit, with what needs no study:
    MLflow takes the writes it was handed and the sweep run is left KILLED, as after Ctrl-C (the
    next session's reconcile closes the trials' runs), and sweep.json records why it ended."""
    writer.submit("closing the sweep run", lambda: session.tracker.finish_parent("KILLED", "interrupted"))
    if session.slots:
        session.slots.leave("storage unreachable", session.slots.entry.done)
    # A database that is away is often MLflow's too: what it does not take soon, `resume` delivers.
    left = writer.close(min(MLFLOW_DRAIN_SECONDS, 30))
    if not any(record is session.record for record in session.state.sessions):  # it stopped before its trials ran
        session.state.sessions.append(session.record)
    ended_session(session.record, "storage unreachable", writer, left, optuna_outages(session.study))
    session.record.error = str(lost)
    workspace.write(session.state)
    session.notifier.send("end", "the sweep stopped: its Optuna storage does not answer", str(lost))
    session.notifier.close()


def ended_session(record: SessionRecord, outcome: str, writer: Writer, left: int, optuna_outage_seconds: float) -> None:
    """Fill in how session ``record`` ended: its ``outcome``, MLflow's outages and the writes it did not
    take (``left``) or failed, and the study storage's outages."""
    record.ended, record.outcome = time.time(), outcome
    record.mlflow_outage_seconds, record.mlflow_writes_pending = sum(writer.outages), left
    record.mlflow_writes_failed, record.optuna_outage_seconds = len(writer.failed), optuna_outage_seconds


def optuna_outages(study: SweepStudy) -> float:
    """The seconds of database outages this session's study storage rode out."""
    return round(sum(study.storage.outages), 1) if isinstance(study.storage, PatientStorage) else 0.0


def rebuild_report(state: SweepState, workspace: Workspace, report: Report) -> None:
    """The HTML report, rebuilt at the end of every session; a failure here never fails the sweep."""
    try:
        index = report(state, workspace.report_dir(state.name))
        progress.say(f"seqae: report: {index}")
    except Exception as exc:  # noqa: BLE001 - `seqae report NAME` rebuilds it later
        log.warning("the report could not be built (%s); `seqae report %s` retries", exc, state.name)


def training_precision(spec: spec_lib.SweepSpec) -> str:
    """What the base config's ``train.precision`` means on the devices the trials get."""

    return describe_precision(cell_configs(spec)[0], torch.device("cuda" if spec.resources.gpu else "cpu"))


def register_best(study: SweepStudy, tracker: Tracker, name: str) -> None:
    front = study.best()
    if front:
        register_front(front, study.spec.objectives, tracker, name)


def register_front(front: list[FrozenTrial], objectives: tuple[Objective, ...], tracker: Tracker, name: str) -> None:
    """Register the model of the best of ``front`` (Optuna's trials; ``@best``: by the first
    objective); with several objectives, every model of the Pareto front, each version tagged with
    its objectives' values and, where the latent's share is one of them, aliased by it
    (``@latent-25pct``), which `seqae encode --at` chooses among; the aliases of shares no longer on
    the front are removed. A version that holds a trial's kept checkpoint already is pointed at again."""
    several = len(objectives) > 1
    best = max(front, key=lambda t: t.values[0] * objectives[0].sign)
    aliases = latent_aliases(front, objectives) if several else {}
    for trial in sorted(front, key=lambda t: t.number) if several else [best]:
        tags = {f"{N.OBJECTIVE}{o.metric}": repr(v) for o, v in zip(objectives, trial.values)} if several else {}
        version, new = tracker.register(
            trial.number, name, ((N.BEST_ALIAS,) if trial is best else ()) + aliases.get(trial.number, ()), tags
        )
        if trial is not best:
            continue
        if version and new:
            progress.say(
                f"seqae: registered the model of trial {trial.number} as {name!r} version {version} (@{N.BEST_ALIAS})"
            )
        elif version:
            progress.say(
                f"seqae: the best model is still trial {trial.number}'s, {name!r} version {version} (@{N.BEST_ALIAS})"
            )
    if several:
        kept = [a for names in aliases.values() for a in names]
        tracker.drop_aliases(name, N.LATENT_ALIAS, set(kept))
        progress.say(
            f"seqae: the Pareto front's {len(front)} models are versions of {name!r}"
            + (f", by latent share: {', '.join('@' + a for a in kept)}" if kept else "")
        )


def latent_aliases(front: list[FrozenTrial], objectives: tuple[Objective, ...]) -> dict[int, tuple[str, ...]]:
    """Each front trial's operating-point alias, by trial number, where the latent's share is an
    objective: one alias per share, on the lowest-numbered trial at it, the smallest share first."""
    metrics = [o.metric for o in objectives]
    if M.LATENT_SHARE not in metrics:
        return {}
    at = metrics.index(M.LATENT_SHARE)
    owners: dict[str, int] = {}
    for trial in sorted(front, key=lambda t: (t.values[at], t.number)):
        owners.setdefault(N.latent_alias(trial.values[at]), trial.number)
    return {n: tuple(a for a, owner in owners.items() if owner == n) for n in dict.fromkeys(owners.values())}


def sweep_params(spec: spec_lib.SweepSpec, state: SweepState) -> Flat:
    """The parent run's params: where the sweep came from, each part of its stored form (a part
    that is a mapping or list as compact JSON, within MLflow's length for a param) and its base
    config, a param per key."""
    params: Flat = {
        "sweep.file": state.file,
        "sweep.fingerprint": state.fingerprint,
        "sweep.planned_trials": state.planned_trials,
        "sweep.forked_from": state.forked_from or "-",
    }
    for part, value in spec.to_dict().items():
        if part != "config":
            shown = json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) else value
            params[f"sweep.{part}"] = (
                shown if len(str(shown)) <= MAX_PARAM_VAL_LENGTH else (str(shown)[: MAX_PARAM_VAL_LENGTH - 3] + "...")
            )
    params.update({f"config.{k}": v for k, v in spec.base.items()})
    return params
