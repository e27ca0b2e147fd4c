"""Creating, forking and extending sweeps, and the control record (`seqae sweep stop|set`).

Everything is checked before anything is created: the sweep file, the name, the workspace, the
backends, the cluster's capacity and the data source. A refusal is a :class:`ConfigError` that
names the key or value."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from optuna.trial import TrialState

from seqae_core import metrics as M
from seqae_core.config import Flat, build
from seqae_core.metrics import epoch_text
from seqae_core.records import RecordStore
from seqae_errors import ConfigError
from sweeps.running.progress import say
from sweeps.running.ray_connection import Cluster, check_resources, join
from sweeps.running.sweep_data import check_data
from sweeps.spec import sweep as spec_lib
from sweeps.spec.sections import MAX_CONCURRENT, MAX_TRIALS, check_limit
from sweeps.stores import ownership
from sweeps.stores.control_channel import Control, StopRequest
from sweeps.stores.mlflow_access import check_credentials
from sweeps.stores.search import SweepStudy, open_study, read_only, study_exists
from sweeps.stores.workspace import (
    DriverLock,
    SweepLocked,
    SweepState,
    Workspace,
    check_name,
    redact,
    resolve_backends,
)


@dataclass(frozen=True)
class Checked:
    """What :func:`create` checked of sweep ``name`` in this process, which the session that runs
    it next, here, does not check again (:func:`sweeps.running.driver.drive`): the sweep file's
    ``spec`` as loaded, its trial configs built under this code (None: not loaded here), MLflow's
    credentials at ``mlflow`` (None: not checked), and the Ray ``cluster`` joined (None: none yet)."""

    name: str
    spec: spec_lib.SweepSpec | None = None
    mlflow: str | None = None
    cluster: Cluster | None = None


def create(
    workspace: Workspace,
    file: str,
    name: str | None,
    sets: list[str],
    overrides: dict[str, str | None],
    or_resume: bool = False,
) -> Checked:
    """Validate a sweep file and record a new sweep; returns its name with what was checked. Nothing
    is created on error.

    With ``or_resume``, an existing sweep of that name is accepted if the file still describes it."""
    file = str(Path(file).resolve())
    spec = spec_lib.load(file, sets)
    name = check_name(name or Path(file).stem)
    workspace.check_paths(name)
    if or_resume and workspace.exists(name):
        state = workspace.read(name)
        ownership.check(name, state.owner, "resume")
        loaded = spec if (file, list(sets)) == (state.file, state.sets) else None  # the file as the sweep reads it
        load_spec(state, check_file=True, current=loaded)
        return Checked(name, loaded)
    if workspace.exists(name):
        state = workspace.read(name)
        raise ConfigError(
            f"a sweep named {name!r} already exists in {workspace.root} ({len(state.sessions)} sessions); "
            f"continue it with `seqae sweep resume {name}`, add trials with `seqae sweep extend {name}`, "
            "or pick another --name"
        )
    warm = warm_starts(workspace, spec)
    backends = resolve_backends(workspace, name, overrides)

    check_credentials(backends.mlflow_tracking_uri)
    cluster = None
    if os.environ.get("RAY_ADDRESS"):
        cluster = join(workspace.root, backends)
        check_resources(spec, cluster.cpus, cluster.gpus)
    else:
        check_resources(spec, float(os.cpu_count() or 1), float(torch.cuda.device_count()))
    check_data(spec)
    workspace.check_writable()

    if study_exists(backends.optuna_storage, name):
        raise ConfigError(
            f"the Optuna storage {redact(backends.optuna_storage)} already has a study named "
            f"{name!r}; pick another --name"
        )
    state = SweepState(
        name=name,
        spec=spec,
        fingerprint=spec.fingerprint(),
        file=file,
        sets=list(sets),
        planned_trials=spec.planned_trials(),
        backends=backends,
        study_name=name,
        warm_starts=warm,
        owner=ownership.actor(),
    )
    with DriverLock(workspace.root / ".create.lock"):
        if workspace.exists(name):
            raise ConfigError(f"a sweep named {name!r} was created by another command just now")
        workspace.write(state)
    for note in spec.notes():
        say(f"seqae: note: {note}")
    return Checked(name, spec, backends.mlflow_tracking_uri, cluster)


def fork(
    workspace: Workspace, origin: str, file: str, name: str | None, sets: list[str], overrides: dict[str, str | None]
) -> str:
    """A new sweep from ``file`` whose study starts with ``origin``'s finished trials that fit its
    space (``SweepStudy.seed_from``); returns its name. Nothing is created if either is refused."""
    source = workspace.read(origin)
    source_spec = source.spec
    objectives = [(o.metric, o.mode) for o in source_spec.objectives]
    if [(o.metric, o.mode) for o in spec_lib.load(file, sets).objectives] != objectives:
        raise ConfigError(
            f"{file} optimizes something else than sweep {origin!r} ({objectives}); a fork keeps "
            "the objectives, or the seeded values would mean something else"
        )
    name = create(workspace, file, name, sets, overrides).name
    state = workspace.read(name)
    state.forked_from = origin
    workspace.write(state)
    study = open_study(state.spec, state.backends.optuna_storage, name, state.total_trials, state.fingerprint)
    origin_study = read_only(source_spec, source.backends.optuna_storage, source.study_name)
    for note in study.seed_from(origin_study):
        say(f"seqae: fork of {origin}: {note}")
    return name


def warm_starts(workspace: Workspace, spec: spec_lib.SweepSpec) -> dict[str, Flat]:
    """``spec.warm_start`` resolved: the ``top`` best complete trials of each earlier sweep it
    names (same objective) whose searched values fit ``spec``'s space, as starting points named
    ``SWEEP.tNUMBER`` (the values of the keys ``spec`` searches; its own base config sets the rest).
    Refused in one line: an unknown sweep, another objective, nothing that fits, or more starting
    points than trials."""
    if spec.warm_start is None:
        return {}
    objectives = [(o.metric, o.mode) for o in spec.objectives]
    points: dict[str, Flat] = {}
    for origin in spec.warm_start.sweeps:
        source = workspace.read(origin)  # an unknown sweep is refused, naming it
        source_spec = source.spec
        if [(o.metric, o.mode) for o in source_spec.objectives] != objectives:
            raise ConfigError(
                f"warm_start.from: sweep {origin!r} optimizes {[o.metric for o in source_spec.objectives]}, "
                f"this sweep {[o.metric for o in spec.objectives]}: its best trials would mean something else"
            )
        backends = source.backends
        study = (
            read_only(source_spec, backends.optuna_storage, source.study_name)
            if study_exists(backends.optuna_storage, source.study_name)
            else None
        )
        found = 0
        for trial in study.ranked() if study else []:
            values = build(
                spec_lib.trial_layers(source_spec.source, source_spec.base, source_spec.values_of(trial.params))
            ).flat()
            params: dict[str, Any] = {}
            for key in spec.sampling_order():
                if spec.search[key].active(params):
                    params[key] = values[key]
            if all(spec.search[k].contains(v) for k, v in params.items()) and params not in points.values():
                points[f"{origin}.t{trial.number}"] = params
                found += 1
                if found == spec.warm_start.top:
                    break
        if not found:
            raise ConfigError(
                f"warm_start.from: sweep {origin!r} has no complete trial whose searched values fit this "
                "sweep's search space"
            )
    if len(spec.start) + len(points) > spec.planned_trials():
        raise ConfigError(
            f"warm_start: {len(points)} configurations and {len(spec.start)} starting points, but the "
            f"sweep plans {spec.planned_trials()} trials; raise trials.total or lower warm_start.top"
        )
    return points


def load_spec(state: SweepState, check_file: bool, current: spec_lib.SweepSpec | None = None) -> spec_lib.SweepSpec:
    """The stored spec, its warm start's configurations among its starting points (after the
    file's own); with ``check_file``, refuse if the sweep file now says something else.
    ``current``: the sweep file as this process loaded it (with the sweep's overrides) just now,
    which is not read again; its trial configs were checked as it loaded (:func:`spec_lib.parse`)."""
    stored = state.spec
    if current is None and check_file and Path(state.file).exists():
        current = spec_lib.load(state.file, state.sets)
    if current is None:
        spec_lib.check_trial_configs(stored)  # under this code, which may have changed since the sweep was created
    elif changes := spec_lib.diff(stored, current):  # none: the stored spec is the one checked as it loaded
        raise ConfigError(
            f"{state.file} changed since sweep {state.name!r} started, so resuming would mix two sweeps:\n"
            f"{changes}\nrestore the file, or run the new version under another --name"
        )
    return stored.model_copy(update={"start": {**stored.start, **state.warm_starts}}) if state.warm_starts else stored


def extend(workspace: Workspace, name: str, trials: int) -> None:
    if trials <= 0:
        raise ConfigError(f"--trials={trials} must be positive")
    with DriverLock(workspace.sweep_dir(name) / "driver.lock"):
        state = workspace.read(name)
        check_limit(
            f"--trials={trials:,} (sweep {name!r} would have {state.total_trials + trials:,} trials)",
            state.total_trials + trials,
            MAX_TRIALS,
        )
        state.extra_trials += trials
        workspace.write(state)


def extend_epochs(workspace: Workspace, name: str, epochs: int, which: str) -> list[str]:
    """`seqae sweep extend NAME --epochs N --trials best:K|3,5`: reopen the chosen finished trials
    to train on from their last checkpoint to ``epochs`` (``SweepStudy.continue_trial``); the next
    driver runs them, and only them. Returns a note per trial; nothing is reopened on error.
    Trials an earlier extend reopened and a driver left unfinished are continued as they are."""
    if epochs < 1:
        raise ConfigError(f"--epochs={epochs} must be positive")
    state = workspace.read(name)
    spec = load_spec(state, check_file=True)
    if spec.multi_objective:
        raise ConfigError(
            f"sweep {name!r} has several objectives; `extend --epochs` trains on single-objective sweeps' trials"
        )
    backends = state.backends
    if not study_exists(backends.optuna_storage, state.study_name):
        raise ConfigError(f"sweep {name!r} has not run yet; nothing to extend")
    with DriverLock(workspace.sweep_dir(name) / "driver.lock"):
        study = open_study(spec, backends.optuna_storage, state.study_name, state.total_trials, state.fingerprint)
        if continuing := study.continuing():
            return [
                f"trial {n}: still training on to {limit} epochs (an earlier extend); it continues"
                for n, limit in continuing.items()
            ]
        if study.remaining() and not study.control().drain:
            raise ConfigError(
                f"sweep {name!r} still has {study.remaining()} trials to run; `seqae sweep resume "
                f"{name}` (or `seqae sweep stop {name}`) first, then extend its finished trials"
            )
        notes, chosen, released = [], [], []
        for number in chosen_trials(study, which):
            progress = RecordStore.of_trial(backends.storage, number).progress()
            if progress is None:
                notes.append(f"trial {number}: left as it is: it has no checkpoint")
            elif progress.released:
                released.append(number)
            elif progress.patience_spent:
                notes.append(
                    f"trial {number}: left as it is: its patience ran out at epoch {epoch_text(progress.epoch)}"
                )
            elif progress.epoch >= epochs:
                notes.append(f"trial {number}: left as it is: it already trained {epoch_text(progress.epoch)} epochs")
            else:
                chosen.append(number)
                notes.append(f"trial {number}: trains on from epoch {epoch_text(progress.epoch)} to {epochs}")
        if released:
            keep = spec.checkpoints.keep_best
            raise ConfigError(
                f"--trials={which}: trials {', '.join(map(str, released))} cannot train on: their "
                f"checkpoints were released when they ended outside the {keep} best "
                f"(checkpoints.keep_best={keep}); extend --trials best:{keep} or fewer, or run the next "
                "sweep with a larger checkpoints.keep_best"
            )
        if not chosen:
            raise ConfigError(f"--epochs={epochs} gives none of the chosen trials more to train:\n" + "\n".join(notes))
        for number in chosen:
            study.continue_trial(number, epochs)
    return notes


def chosen_trials(study: SweepStudy, which: str) -> list[int]:
    """``best:K``: the K best complete trials; ``3,5``: those trials (complete or pruned)."""
    if which.startswith("best:"):
        k = which.removeprefix("best:")
        if not k.isdigit() or int(k) < 1:
            raise ConfigError(f"--trials={which!r}: best:K needs a positive count K")
        return [t.number for t in study.ranked()[: int(k)]]
    trials = {t.number: t for t in study.trials()}
    numbers = [n.strip() for n in which.split(",")]
    if not all(n.isdigit() for n in numbers):
        raise ConfigError(f"--trials={which!r}: give best:K or trial numbers separated by commas")
    for n in map(int, numbers):
        if n not in trials or trials[n].state not in (TrialState.COMPLETE, TrialState.PRUNED):
            raise ConfigError(
                f"--trials={which!r}: trial {n} is "
                f"{trials[n].state.name if n in trials else 'not in the sweep'}; only complete or "
                "pruned trials train on"
            )
    return list(map(int, numbers))


def running_changes(**changes: int | str) -> dict[str, int]:
    """What `seqae sweep set` may change in a running sweep, checked: ``max_concurrent``, a whole
    number (or its digits) from 1 to seqae's limit."""
    unknown = sorted(changes.keys() - {"max_concurrent"})
    if unknown or not changes:
        raise ConfigError(f"{(unknown or [''])[0]!r}: a running sweep can change max_concurrent=N only")
    value = changes["max_concurrent"]
    if isinstance(value, bool) or not str(value).isdigit() or int(value) < 1:
        raise ConfigError(f"max_concurrent={value!r} must be a whole number of at least 1")
    check_limit(f"max_concurrent={int(value):,}", int(value), MAX_CONCURRENT)
    return {"max_concurrent": int(value)}


def control(workspace: Workspace, name: str, **changes: Any) -> Control:
    """``seqae sweep stop|set``: record in the sweep's study what its driver is asked to do, where
    a driver on this machine or on a cluster (a submitted sweep) reads it before each new trial.
    For the sweep's owner (the study's, else its record's) and MLflow's admin: the record's log
    names who asked."""
    if "max_concurrent" in changes:
        running_changes(max_concurrent=changes["max_concurrent"])
    study, owner = _user_study(workspace, name)
    who = ownership.check(name, study.owner or owner, "stop" if "drain" in changes else "set")
    return study.set_control(who, **changes)


@dataclass(frozen=True)
class TrialStop:
    """What `seqae sweep stop --trial` recorded: trial ``trial`` of sweep ``sweep`` stops at its next
    validation (``now``: at once, mid-epoch), as asked ``by``; ``driving``: whether a driver runs
    the sweep here now (None: a submitted sweep, whose driver is its job's)."""

    sweep: str
    trial: int
    now: bool
    by: str
    driving: bool | None


def stop_trial(workspace: Workspace, name: str, number: int, now: bool = False) -> TrialStop:
    """`seqae sweep stop NAME --trial N [--now]`: record in trial ``number``'s Optuna record that it
    is to stop (:meth:`SweepStudy.ask_stop`), where the sweep's driver, here or on a cluster,
    reads it (:class:`sweeps.running.stoppers.TrialStops`); a driver that starts later ends it
    before any trial runs (:func:`sweeps.stores.ledger.reconcile_study`). For the sweep's owner and
    MLflow's admin. A trial that is unknown or not running is refused, naming it."""
    study, owner = _user_study(workspace, name)
    who = ownership.check(name, study.owner or owner, "stop")
    if now and study.spec.resources.fuse > 1:
        raise ConfigError(
            f"--now: sweep {name!r} trains its trials in packs (resources.fuse="
            f"{study.spec.resources.fuse}), and stopping one mid-epoch would stop its pack; without "
            "--now it leaves its pack at its next validation"
        )
    study.ask_stop(number, StopRequest(by=who, at=time.strftime("%Y-%m-%d %H:%M:%S"), now=now))
    driving = None
    if workspace.exists(name):
        try:
            with DriverLock(workspace.sweep_dir(name) / "driver.lock"):
                driving = False
        except SweepLocked:
            driving = True
    return TrialStop(name, number, now, who, driving)


def retry(workspace: Workspace, name: str, which: str | None) -> list[str]:
    """`seqae sweep retry NAME [--trials N,M | --failed]` (``which``: ``"3,5"``; None: every failed
    trial): each chosen failed trial gets a new attempt with its parameters (:meth:`SweepStudy.retry`),
    from the failed attempt's last good checkpoint where it kept one, else from its first epoch;
    the next driver runs them. Refused, before anything changes, while a driver runs the sweep, and
    for a trial that is unknown or did not fail. Returns a note per trial."""
    state = workspace.read(name)
    spec = load_spec(state, check_file=True)
    backends = state.backends
    if not study_exists(backends.optuna_storage, state.study_name):
        raise ConfigError(f"sweep {name!r} has not run yet; nothing to retry")
    with DriverLock(workspace.sweep_dir(name) / "driver.lock"):  # a driver that runs: refused, naming it
        study = open_study(spec, backends.optuna_storage, state.study_name, state.total_trials, state.fingerprint)
        numbers = failed_trials(study, name, which)
        notes = []
        for n in numbers:
            store = RecordStore.of_trial(backends.storage, n)
            progress = store.progress()
            store.clear_verdict()  # the user says its cause is fixed
            if progress is not None and progress.history and not progress.released:
                values = (
                    {}
                    if spec.multi_objective
                    else {M.result_number(h): float(h[spec.objectives[0].metric]) for h in progress.history}
                )
                attempt = study.retry(n, values)
                notes.append(
                    f"trial {n}: attempt {attempt}, with its parameters, from its checkpoint at epoch "
                    f"{epoch_text(progress.epoch)} (the failed attempt's last good one)"
                )
            else:
                store.start_over()
                attempt = study.retry(n)
                notes.append(
                    f"trial {n}: attempt {attempt}, with its parameters, from scratch (the failed attempt "
                    "kept no checkpoint)"
                )
    return notes


def failed_trials(study: SweepStudy, name: str, which: str | None) -> list[int]:
    """The failed trials of sweep ``name`` that ``which`` names (``"3,5"``; None: every failed one),
    for `seqae sweep retry`; refused, naming it, for a trial that is unknown or did not fail."""
    trials = {t.number: t for t in study.trials()}
    failed = [n for n, t in trials.items() if t.state == TrialState.FAIL]
    if which is None:
        if not failed:
            raise ConfigError(f"--failed: sweep {name!r} has no failed trials")
        return failed
    parts = [n.strip() for n in which.split(",")]
    if not all(p.isdigit() for p in parts):
        raise ConfigError(f"--trials={which!r}: give trial numbers separated by commas, e.g. 3,5")
    numbers = list(dict.fromkeys(map(int, parts)))
    for n in numbers:
        if n not in trials or trials[n].state != TrialState.FAIL:
            raise ConfigError(
                f"--trials={which!r}: trial {n} is "
                f"{trials[n].state.name if n in trials else 'not in the sweep'}; only failed "
                f"trials are retried (failed: {', '.join(map(str, failed)) or 'none'})"
            )
    return numbers


def check_retry(workspace: Workspace, name: str, which: str | None) -> None:
    """Refuse, before a job is submitted for it, a retry of a sweep on a cluster that names no
    failed trial of its study (read through the stores its submission named)."""
    failed_trials(_user_study(workspace, name)[0], name, which)


def _user_study(workspace: Workspace, name: str) -> tuple[SweepStudy, str | None]:
    """Sweep ``name``'s study, for a user's command on it, and its recorded owner: from this
    workspace's record, else from its submission's. A sweep whose driver has not created its study
    is refused."""
    if workspace.exists(name):
        state = workspace.read(name)
        spec, url, owner = state.spec, state.backends.optuna_storage, state.owner
    elif (record := workspace.read_submission(name)) is not None:
        spec, owner = spec_lib.load(record.sweep_file, record.sets), record.owner
        url = record.backends.optuna_storage if record.backends else ""
    else:
        workspace.read(name)  # raises: no such sweep
    if not url or not study_exists(url, name):
        raise ConfigError(
            f"sweep {name!r} has not started yet (no Optuna study {name!r} at "
            f"{redact(url) or 'a storage its submission names'})"
        )
    return read_only(spec, url, name), owner
