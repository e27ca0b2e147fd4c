"""The sweep service: run, resume, extend, status and list.

Everything is checked before anything is created: the sweep file, the name, the workspace and
the backends. A sweep's durable state is its Optuna study (which trials exist and how they
ended), its trials' checkpoint stores (how far each trial got, with its metric history) and its
MLflow runs (found by tags). A driver that starts, for a new sweep or an interrupted one, first
reconciles MLflow with the study and the checkpoints, then runs the trials that are left.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from seqae_core import data as data_lib
from seqae_core.config import Config, build
from seqae_errors import ConfigError
from sweeps import spec as spec_lib
from sweeps.workspace import Backends, DriverLock, SweepState, Workspace, check_name, redact

log = logging.getLogger(__name__)

EXIT_OK, EXIT_INTERRUPTED = 0, 130
MLFLOW_DRAIN_SECONDS = float(os.environ.get("SEQAE_MLFLOW_DRAIN_SECONDS", "300"))


def resolve_backends(workspace: Workspace, name: str, overrides: dict[str, str | None]) -> Backends:
    """Flags, then ``SEQAE_*`` environment variables, then the workspace's embedded defaults."""
    defaults = workspace.default_backends(name)
    chosen = Backends(
        mlflow_tracking_uri=overrides.get("mlflow_tracking_uri") or os.environ.get("SEQAE_MLFLOW_TRACKING_URI")
        or defaults.mlflow_tracking_uri,
        optuna_storage=overrides.get("optuna_storage") or os.environ.get("SEQAE_OPTUNA_STORAGE")
        or defaults.optuna_storage,
        storage=overrides.get("storage") or os.environ.get("SEQAE_STORAGE") or defaults.storage,
    )
    for label, uri in (("the MLflow tracking URI", chosen.mlflow_tracking_uri),
                       ("the Optuna storage", chosen.optuna_storage), ("the storage", chosen.storage)):
        if redact(uri) != uri:
            raise ConfigError(f"{label} {redact(uri)} carries a password; give it through the environment "
                              "(PGPASSWORD or ~/.pgpass for PostgreSQL, MLFLOW_TRACKING_PASSWORD for MLflow)")
    if chosen.storage != defaults.storage and "://" not in chosen.storage:
        chosen.storage = str(Path(chosen.storage).expanduser().resolve() / name)
    elif "://" in chosen.storage and chosen.storage != defaults.storage:
        chosen.storage = f"{chosen.storage.rstrip('/')}/{name}"
    return chosen


def check_cluster(backends: Backends) -> None:
    """Refuse SQLite backends when the Ray cluster has more than one node."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1 and backends.local:
        raise ConfigError(
            f"this Ray cluster has {len(nodes)} nodes, but the sweep would keep MLflow or Optuna in SQLite files "
            "on the driver's disk: trials on other nodes could not be tracked, and SQLite locks under concurrent "
            "writers. Start an MLflow server and a PostgreSQL database (`seqae cluster up` does both) and set "
            "SEQAE_MLFLOW_TRACKING_URI and SEQAE_OPTUNA_STORAGE."
        )


def check_resources(spec: spec_lib.SweepSpec, cpus: float, gpus: float) -> None:
    """Refuse a trial that asks for more than the cluster (or this machine) has: Ray would wait
    for such resources forever."""
    if spec.gpu > gpus:
        raise ConfigError(f"{spec.source}: resources.gpu={spec.gpu} per trial, but "
                          f"{'no GPU is' if not gpus else f'only {gpus:g} GPUs are'} available; set resources.gpu=0 "
                          "to train on CPUs")
    if spec.cpu > cpus:
        raise ConfigError(f"{spec.source}: resources.cpu={spec.cpu} per trial, but only {cpus:g} CPUs are available")


def cluster_capacity() -> tuple[float, float]:
    """(CPUs, GPUs) of the largest alive node of the connected Ray cluster: what one trial can get."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    return max(n.get("CPU", 0.0) for n in nodes), max(n.get("GPU", 0.0) for n in nodes)


def connect_ray(home: Path) -> None:
    """Join the cluster named by RAY_ADDRESS, or start a local one that lives with this process.

    In a cluster the driver then works from ``home`` (the workspace): the node may unpack a Ray
    Job's package again, at the same path, whenever a runtime env is set up, which leaves a
    driver inside it in a deleted folder. Paths are absolute by then."""
    import ray

    os.environ.setdefault("RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS", "0")
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], logging_level=logging.WARNING)
        home.mkdir(parents=True, exist_ok=True)
        os.chdir(home)
    else:
        ray.init(include_dashboard=False, logging_level=logging.WARNING)


def create(workspace: Workspace, file: str, name: str | None, sets: list[str], overrides: dict[str, str | None],
           or_resume: bool = False) -> str:
    """Validate a sweep file and record a new sweep; returns its name. Nothing is created on error.

    With ``or_resume``, an existing sweep of that name is accepted if the file still describes it."""
    file = str(Path(file).resolve())
    spec = spec_lib.load(file, sets)
    name = check_name(name or Path(file).stem)
    workspace.check_paths(name)
    if or_resume and workspace.exists(name):
        load_spec(workspace.read(name), check_file=True)
        return name
    if workspace.exists(name):
        state = workspace.read(name)
        raise ConfigError(
            f"a sweep named {name!r} already exists in {workspace.root} ({len(state.sessions)} sessions); "
            f"continue it with `seqae sweep resume {name}`, add trials with `seqae sweep extend {name}`, "
            "or pick another --name"
        )
    backends = resolve_backends(workspace, name, overrides)
    from sweeps.tracking import check_credentials

    check_credentials(backends.mlflow_tracking_uri)
    if os.environ.get("RAY_ADDRESS"):
        connect_ray(workspace.root)
        check_cluster(backends)
        check_resources(spec, *cluster_capacity())
    else:
        import torch

        check_resources(spec, float(os.cpu_count() or 1), float(torch.cuda.device_count()))
    check_data(spec)
    workspace.check_writable()
    from sweeps.search import study_exists

    if study_exists(backends.optuna_storage, name):
        raise ConfigError(f"the Optuna storage {redact(backends.optuna_storage)} already has a study named "
                          f"{name!r}; pick another --name")
    state = SweepState(
        name=name, spec=spec.to_dict(), fingerprint=spec.fingerprint(), file=file,
        sets=list(sets), planned_trials=spec.planned_trials(), backends=asdict(backends), study_name=name,
    )
    with DriverLock(workspace.root / ".create.lock"):
        if workspace.exists(name):
            raise ConfigError(f"a sweep named {name!r} was created by another command just now")
        workspace.write(state)
    return name


def fork(workspace: Workspace, origin: str, file: str, name: str | None, sets: list[str],
         overrides: dict[str, str | None]) -> str:
    """A new sweep from ``file`` whose study starts with ``origin``'s finished trials that fit its
    space (``SweepStudy.seed_from``); returns its name. Nothing is created if either is refused."""
    from sweeps.search import open_study, read_only

    source = workspace.read(origin)
    source_spec = spec_lib.parse(source.spec, source.file)
    objectives = [(o.metric, o.mode) for o in source_spec.objectives]
    if [(o.metric, o.mode) for o in spec_lib.load(file, sets).objectives] != objectives:
        raise ConfigError(f"{file} optimizes something else than sweep {origin!r} ({objectives}); a fork keeps "
                          "the objectives, or the seeded values would mean something else")
    name = create(workspace, file, name, sets, overrides)
    state = workspace.read(name)
    state.forked_from = origin
    workspace.write(state)
    spec = spec_lib.parse(state.spec, state.file)
    study = open_study(spec, state.backends["optuna_storage"], name, state.total_trials, state.fingerprint)
    origin_study = read_only(source_spec, Backends(**source.backends).optuna_storage, source.study_name)
    for note in study.seed_from(origin_study):
        print(f"seqae: fork of {origin}: {note}", flush=True)
    return name


def load_spec(state: SweepState, check_file: bool) -> spec_lib.SweepSpec:
    """The stored spec; with ``check_file``, refuse if the sweep file now says something else."""
    stored = spec_lib.parse(state.spec, state.file)
    if check_file and Path(state.file).exists():
        current = spec_lib.load(state.file, state.sets)
        changes = spec_lib.diff(stored, current)
        if changes:
            raise ConfigError(
                f"{state.file} changed since sweep {state.name!r} started, so resuming would mix two sweeps:\n"
                f"{changes}\nrestore the file, or run the new version under another --name"
            )
    return stored


def extend(workspace: Workspace, name: str, trials: int) -> None:
    if trials <= 0:
        raise ConfigError(f"--trials={trials} must be positive")
    with DriverLock(workspace.sweep_dir(name) / "driver.lock"):
        state = workspace.read(name)
        spec_lib.check_limit(f"--trials={trials:,} (sweep {name!r} would have {state.total_trials + trials:,} trials)",
                             state.total_trials + trials, spec_lib.MAX_TRIALS)
        state.extra_trials += trials
        workspace.write(state)


def extend_epochs(workspace: Workspace, name: str, epochs: int, which: str) -> list[str]:
    """`seqae sweep extend NAME --epochs N --trials best:K|3,5`: reopen the chosen finished trials
    to train on from their last checkpoint to ``epochs`` (``SweepStudy.continue_trial``); the next
    driver runs them, and only them. Returns a note per trial; nothing is reopened on error.
    Trials an earlier extend reopened and a driver left unfinished are continued as they are."""
    from seqae_core.checkpoint import CheckpointStore
    from sweeps.search import open_study, study_exists

    if epochs < 1:
        raise ConfigError(f"--epochs={epochs} must be positive")
    state = workspace.read(name)
    spec = load_spec(state, check_file=True)
    if spec.multi_objective:
        raise ConfigError(f"sweep {name!r} has several objectives; `extend --epochs` trains on single-objective "
                          "sweeps' trials")
    backends = Backends(**state.backends)
    if not study_exists(backends.optuna_storage, state.study_name):
        raise ConfigError(f"sweep {name!r} has not run yet; nothing to extend")
    with DriverLock(workspace.sweep_dir(name) / "driver.lock"):
        study = open_study(spec, backends.optuna_storage, state.study_name, state.total_trials, state.fingerprint)
        if continuing := study.continuing():
            return [f"trial {n}: still training on to {limit} epochs (an earlier extend); it continues"
                    for n, limit in continuing.items()]
        if study.remaining() and not study.control().get("drain"):
            raise ConfigError(f"sweep {name!r} still has {study.remaining()} trials to run; `seqae sweep resume "
                              f"{name}` (or `seqae sweep stop {name}`) first, then extend its finished trials")
        notes, chosen = [], []
        for number in chosen_trials(study, which):
            progress = CheckpointStore.of_trial(backends.storage, number).progress()
            if progress is None:
                notes.append(f"trial {number}: left as it is: it has no checkpoint")
            elif progress.patience_spent:
                notes.append(f"trial {number}: left as it is: its patience ran out at epoch {progress.epoch}")
            elif progress.epoch >= epochs:
                notes.append(f"trial {number}: left as it is: it already trained {progress.epoch} epochs")
            else:
                chosen.append(number)
                notes.append(f"trial {number}: trains on from epoch {progress.epoch} to {epochs}")
        if not chosen:
            raise ConfigError(f"--epochs={epochs} gives none of the chosen trials more to train:\n" + "\n".join(notes))
        for number in chosen:
            study.continue_trial(number, epochs)
    return notes


def chosen_trials(study: Any, which: str) -> list[int]:
    """``best:K``: the K best complete trials; ``3,5``: those trials (complete or pruned)."""
    from optuna.trial import TrialState

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
            raise ConfigError(f"--trials={which!r}: trial {n} is "
                              f"{trials[n].state.name if n in trials else 'not in the sweep'}; only complete or "
                              "pruned trials train on")
    return list(map(int, numbers))


@dataclass
class Session:
    """What one driver holds while it runs a sweep."""

    state: SweepState
    spec: spec_lib.SweepSpec
    backends: Backends
    study: Any  # sweeps.search.SweepStudy
    tracker: Any  # sweeps.tracking.Tracker
    epochs: int  # the most any trial may run
    data_seconds: float
    published: dict[Any, str]  # the data entries published for the trials' nodes (none: they read the driver's cache)
    record: dict[str, Any]  # this session's entry in sweep.json


def drive(workspace: Workspace, name: str, *, check_file: bool = True, verbose: bool = False,
          extending: bool = False) -> int:
    """Run what is left of a sweep: open its stores, reconcile them, run the trials, close the books.
    ``extending`` (`seqae sweep extend --epochs`) keeps a stopped sweep stopped: only the trials
    it reopened run."""
    from sweeps import ledger

    workspace.read(name)  # an unknown sweep is refused before anything is written
    workspace.check_writable()
    # `ray job stop` and service managers send SIGTERM: stop as gracefully as on Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    with DriverLock(workspace.sweep_dir(name) / "driver.lock"):
        session = open_session(workspace, name, check_file)
        for note in ledger.reconcile(session.study, session.backends.storage, session.tracker, not extending):
            print(f"seqae: {note}", flush=True)
        writer = run(workspace, session, verbose)
        left = close(workspace, session, writer)
    outcome = session.record["outcome"]
    print(f"seqae: sweep {name}: {outcome}; trials by state: {session.record['trials']}", flush=True)
    if left:
        print(f"seqae: warning: MLflow did not take {left} writes before the sweep ended; the data is safe in the "
              f"trials' checkpoints and `seqae sweep resume {name}` delivers it", flush=True)
    if outcome != "complete":
        print(f"seqae: continue it with `seqae sweep resume {name}`", flush=True)
    return EXIT_OK if outcome in ("complete", "stopped") and not session.record["interrupted"] else EXIT_INTERRUPTED


def open_session(workspace: Workspace, name: str, check_file: bool) -> Session:
    """The sweep's record, its data (prepared once), its Optuna study and its MLflow runs."""
    from sweeps.search import open_study
    from sweeps.tracking import Tracker, check_credentials

    state = workspace.read(name)
    spec = load_spec(state, check_file)
    backends = Backends(**state.backends)
    check_credentials(backends.mlflow_tracking_uri)  # before the data is prepared, which may take minutes
    if os.environ.get("RAY_ADDRESS"):
        connect_ray(workspace.root)
        check_cluster(backends)
    started = time.time()
    epochs, entries, published = prepare_data(spec, str(workspace.cache_dir),
                                              published_data(workspace, backends.storage))
    data_seconds = time.time() - started
    study = open_study(spec, backends.optuna_storage, state.study_name, state.total_trials, state.fingerprint)
    tracker = Tracker(backends.mlflow_tracking_uri, name, backends.storage,
                      workspace.artifact_root if backends.mlflow_tracking_uri.startswith("sqlite:") else None,
                      spec.share, entries)
    objective = spec.objectives[0]
    tracker.open(state.fingerprint, state.mlflow_experiment_id, state.mlflow_parent_run_id, sweep_params(spec, state),
                 (objective.metric, objective.mode))
    state.mlflow_experiment_id, state.mlflow_parent_run_id = tracker.experiment_id, tracker.parent_run_id
    record = {"started": started, "pid": os.getpid(), "host": socket.gethostname(), "outcome": "running",
              "job": os.environ.get("RAY_JOB_ID")}
    return Session(state, spec, backends, study, tracker, epochs, data_seconds, published, record)


def run(workspace: Workspace, session: Session, verbose: bool) -> Any:
    """Run the trials the study still has to run; returns the MLflow writer, still delivering."""
    from sweeps import progress, runner
    from sweeps.tracking import unreachable
    from sweeps.writer import Writer

    state, spec, study = session.state, session.spec, session.study
    state.sessions.append(session.record)
    workspace.write(state)
    writer = Writer(unreachable, session.tracker.note_outage)
    todo = study.remaining()
    print(f"seqae: sweep {state.name}{f' (profile {spec.profile})' if spec.profile else ''}: "
          f"{state.total_trials} trials planned, {todo} to run "
          f"(data ready in {session.data_seconds:.1f} s; training in {training_precision(spec)})", flush=True)
    session.record["interrupted"] = False
    if todo:
        connect_ray(workspace.root)
        check_resources(spec, *cluster_capacity())
        try:
            runner.run_session(spec, study, session.tracker, writer, storage=session.backends.storage,
                               cache_dir=str(workspace.cache_dir), published=session.published,
                               session=len(state.sessions),
                               epochs=session.epochs, verbose=verbose)
        except KeyboardInterrupt:
            session.record["interrupted"] = True
        print(f"\n{progress.summary(study.trials(), spec.objectives)}\n", flush=True)
    return writer


def close(workspace: Workspace, session: Session, writer: Any) -> int:
    """Pause the trials left unfinished, register the best model once the sweep is complete, let
    MLflow take the writes, record the session and rebuild the report. Returns the writes MLflow
    did not take in time (they are safe in the checkpoints; the next session delivers them)."""
    from sweeps import ledger

    study, tracker, name = session.study, session.tracker, session.state.name
    complete = study.remaining() == 0
    for number in study.numbers(ledger.Outcome.RUNNING.optuna_state):  # continued by the next session
        writer.submit(f"pausing trial {number}", partial(tracker.trial_ended, number, ledger.Outcome.RUNNING))
    if complete:
        writer.submit("registering the best model", lambda: register_best(study, tracker, name))
    writer.submit("closing the sweep run", lambda: tracker.finish_parent("FINISHED" if complete else "KILLED"))
    left = writer.close(MLFLOW_DRAIN_SECONDS)
    control = study.control()
    outcome = "complete" if complete else "stopped" if control.get("drain") else "interrupted"
    session.record.update(ended=time.time(), outcome=outcome, control=control, trials=study.counts(),
                          mlflow_outage_seconds=sum(writer.outages), mlflow_writes_pending=left,
                          mlflow_writes_failed=len(writer.failed))
    workspace.write(session.state)
    if not left:
        rebuild_report(session.state, workspace)
    return int(left)


def rebuild_report(state: SweepState, workspace: Workspace) -> None:
    """The HTML report, rebuilt at the end of every session; a failure here never fails the sweep."""
    from dashboards import report

    try:
        index = report.build(state, workspace.report_dir(state.name))
        print(f"seqae: report: {index}", flush=True)
    except Exception as exc:  # noqa: BLE001 - `seqae report NAME` rebuilds it later
        log.warning("the report could not be built (%s); `seqae report %s` retries", exc, state.name)


def cell_configs(spec: spec_lib.SweepSpec) -> list[Config]:
    """The config of every grid cell (searched keys at their base values)."""
    return [build(spec_lib.trial_layers(spec.source, spec.base, cell)) for cell in spec.cells()]


def check_data(spec: spec_lib.SweepSpec) -> None:
    """Every data source the sweep reads loads (its tokenizer, and a first page with the text
    column), so that an unreachable Hub or a missing folder fails before anything is created."""
    sources = {replace(c.data, input_len=1, samples="first", max_pages=1, vocab="tokenizer")
               for c in cell_configs(spec)}
    for source in sources:
        data_lib.check_source(source)


def published_data(workspace: Workspace, storage: str) -> str | None:
    """Where the driver publishes the prepared data for the trials' nodes: beside the checkpoints,
    when they go to an object store or to a folder outside the workspace (shared by a cluster's
    nodes). None when they stay in the workspace: the trials then read the driver's cache."""
    if "://" in storage or not Path(storage).resolve().is_relative_to(workspace.root.resolve()):
        return f"{storage.rstrip('/')}/data"
    return None


def prepare_data(spec: spec_lib.SweepSpec, cache_dir: str,
                 data_uri: str | None) -> tuple[int, dict[Any, Path], dict[Any, str]]:
    """Tokenize, once, the data of every grid cell, and publish it to ``data_uri`` if given.
    Returns the most epochs any trial may run, and by data settings (``seqae_core.data.shared_settings``)
    the driver's cache entry (what the trials' MLflow runs record as their dataset) and the URI of
    each published one."""
    configs = cell_configs(spec)
    entries, published = {}, {}
    for data_config in {data_lib.shared_settings(c.data) for c in configs}:
        entry = entries[data_config] = data_lib.prepare(data_config, Path(cache_dir))
        if data_uri:
            moved = data_lib.publish(entry, data_uri)
            published[data_config] = f"{data_uri}/{entry.name}"
            print(f"seqae: data entry {entry.name} published to {data_uri}"
                  + (f" ({moved / 2**20:.1f} MiB)" if moved else " (already there)"), flush=True)
    return max(c.train.epochs for c in configs), entries, published


def training_precision(spec: spec_lib.SweepSpec) -> str:
    """What the base config's ``train.precision`` means on the devices the trials get."""
    import torch

    from seqae_core.train import describe_precision

    return describe_precision(cell_configs(spec)[0], torch.device("cuda" if spec.gpu else "cpu"))


def register_best(study: Any, tracker: Any, name: str) -> None:
    best = study.best()
    if not best:
        return
    trial = max(best, key=lambda t: t.values[0] * (1 if study.spec.objectives[0].mode == "max" else -1))
    version = tracker.register_best(trial.number, name)
    if version:
        print(f"seqae: registered the model of trial {trial.number} as {name!r} version {version}", flush=True)


def sweep_params(spec: spec_lib.SweepSpec, state: SweepState) -> dict[str, Any]:
    """The parent run's params: the sweep's settings and its base config."""
    params: dict[str, Any] = {
        "sweep.file": state.file, "sweep.fingerprint": state.fingerprint, "sweep.trials": state.planned_trials,
        "sweep.sampler": spec.sampler, "sweep.seed": spec.seed, "sweep.scheduler": spec.scheduler,
        "sweep.objective": ",".join(f"{o.metric}:{o.mode}" for o in spec.objectives),
        "sweep.grid": ",".join(spec.grid) or "-", "sweep.search": ",".join(spec.search) or "-",
        "sweep.resources": f"cpu={spec.cpu},gpu={spec.gpu}", "sweep.max_concurrent": spec.max_concurrent,
        "sweep.retries": spec.retries, "sweep.profile": spec.profile or "-",
        "sweep.forked_from": state.forked_from or "-",
    }
    params.update({f"config.{k}": v for k, v in spec.base.items()})
    return params


def status(workspace: Workspace, name: str) -> dict[str, Any]:
    """Trials by state, the best so far, and where the runs and the study live."""
    state = workspace.read(name)
    spec = spec_lib.parse(state.spec, state.file)
    backends = Backends(**state.backends)
    last = state.sessions[-1] if state.sessions else {}
    return {
        "name": name,
        "workspace": str(workspace.root),
        "outcome": last.get("outcome", "not started"),
        **trials_view(spec, backends, state.study_name, state.total_trials),
        "mlflow_experiment_id": state.mlflow_experiment_id,
        "mlflow_parent_run_id": state.mlflow_parent_run_id,
        "sessions": len(state.sessions),
        "job": state.job,
        "forked_from": state.forked_from,
    }


def submitted_status(record: dict[str, Any]) -> dict[str, Any]:
    """The status of a sweep submitted from this workspace whose state lives in the cluster's
    (``record["workspace"]``): its trials, best and cost, read from the backends the submission
    named (its Optuna study, MLflow experiment and storage), beside its job's state."""
    from mlflow.tracking import MlflowClient

    from sweeps.submit import job_info
    from sweeps.tracking import check_credentials

    spec = spec_lib.load(str(Path(record["working_dir"]) / record["file"]), record["sets"])
    backends = Backends(**record["backends"])
    check_credentials(backends.mlflow_tracking_uri)
    view = trials_view(spec, backends, record["name"], spec.planned_trials())
    job = job_info(record)
    by_state = view["trials_by_state"]
    complete = not by_state.get("NOT_STARTED") and set(by_state) <= {"COMPLETE", "PRUNED", "FAIL"}
    experiment = MlflowClient(backends.mlflow_tracking_uri).get_experiment_by_name(record["name"])
    return {
        "name": record["name"],
        "workspace": record["workspace"],
        "outcome": "complete" if complete and by_state else f"job {job['status']}",
        **view,
        "mlflow_experiment_id": experiment.experiment_id if experiment else None,
        "mlflow_parent_run_id": None,
        "sessions": len(record["jobs"]),
        "job": job,
        "forked_from": None,
    }


def trials_view(spec: spec_lib.SweepSpec, backends: Backends, study_name: str, total: int) -> dict[str, Any]:
    """What a sweep's Optuna study and trial stores say: trials by state, the best, the control
    record, the cost; and where the runs and the study live."""
    from sweeps.search import read_only

    study = read_only(spec, backends.optuna_storage, study_name)
    by_state = study.counts()
    created = sum(by_state.values())
    if created < total:
        by_state["NOT_STARTED"] = total - created
    best = [
        {"trial": t.number, "values": dict(zip((o.metric for o in spec.objectives), t.values)), "params": t.params}
        for t in study.best()
    ]
    return {
        "profile": spec.profile,
        "description": spec.description,
        "trials_total": total,
        "trials_by_state": by_state,
        "best": best[0] if len(best) == 1 else best or None,
        "objectives": [f"{o.metric} ({o.mode})" for o in spec.objectives],
        "mlflow_tracking_uri": redact(backends.mlflow_tracking_uri),
        "optuna_storage": redact(backends.optuna_storage),
        "optuna_study_name": study_name,
        "storage": backends.storage,
        "control": study.control(),
        "cost": cost(spec, backends.storage, study),
        "seeded_trials": len(study.forked()),
    }


def cost(spec: spec_lib.SweepSpec, storage: str, study: Any) -> dict[str, Any]:
    """Resource-hours spent per trial and in all, against the budget (``ledger.resource_seconds``)."""
    from seqae_core.checkpoint import CheckpointStore
    from sweeps.ledger import resource_seconds

    per_trial = {t.number: resource_seconds(spec.share[1], CheckpointStore.of_trial(storage, t.number).progress())
                 for t in study.trials()}
    return {"unit": f"{spec.share[0]}-hours", "hours": round(sum(per_trial.values()) / 3600, 6),
            "budget": spec.budget[1] if spec.budget else None,
            "per_trial_seconds": {str(n): round(s, 2) for n, s in per_trial.items()}}


def control(workspace: Workspace, name: str, **changes: Any) -> dict[str, Any]:
    """``seqae sweep stop|set``: record in the sweep's study what its driver is asked to do, where
    a driver on this machine or on a cluster (a submitted sweep) reads it before each new trial."""
    from sweeps import submit
    from sweeps.search import read_only, study_exists

    if "max_concurrent" in changes:
        spec_lib.check_limit(f"max_concurrent={changes['max_concurrent']:,}", changes["max_concurrent"],
                             spec_lib.MAX_CONCURRENT)
    if workspace.exists(name):
        state = workspace.read(name)
        spec, url = spec_lib.parse(state.spec, state.file), Backends(**state.backends).optuna_storage
    elif (record := submit.read_record(workspace, name)) is not None:
        spec, url = spec_lib.load(record["file"], record["sets"]), os.environ.get("SEQAE_OPTUNA_STORAGE", "")
    else:
        workspace.read(name)  # raises: no such sweep
    if not url or not study_exists(url, name):
        raise ConfigError(f"sweep {name!r} has not started yet (no Optuna study {name!r} at "
                          f"{redact(url) or 'SEQAE_OPTUNA_STORAGE, which is unset'})")
    return read_only(spec, url, name).set_control(**changes)


def listing(workspace: Workspace) -> list[dict[str, Any]]:
    rows = []
    for name in workspace.names():
        if not workspace.exists(name):  # submitted; its state lives on the cluster
            rows.append({"name": name, "trials": 0, "outcome": "submitted", "by_state": {}, "file": ""})
            continue
        state = workspace.read(name)
        last = state.sessions[-1] if state.sessions else {}
        rows.append({
            "name": name, "trials": state.total_trials, "outcome": last.get("outcome", "not started"),
            "by_state": last.get("trials", {}), "file": state.file,
        })
    return rows
