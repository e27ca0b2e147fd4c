"""seqae from Python, and the one door the command line goes through: each verb of ``seqae sweep``
(and ``seqae encode``, ``seqae report`` and ``seqae ui``) is a method of :class:`Sweep` or a function
here, and :mod:`seqae.cli` only parses its arguments, calls it and prints what it returns. It sits
above the sweep service and the dashboards, and hands the driver the report it writes as each
session ends (:func:`dashboards.report.page.build`).

A refusal is a :class:`~seqae_errors.ConfigError` naming the key or value, a database that stayed
away a :class:`~seqae_errors.StorageUnreachable`. Nothing here exits, and nothing prints unless
asked: :func:`show_progress` prints the driver's lines as they come (the command line calls it).

    import seqae

    seqae.show_progress()
    sweep = seqae.Sweep.run("sweeps/studies/quickstart.yaml", set=["data.path=../shared/data/wikipedia-mini"])
    sweep.status().best[0]          # the best trial: validation (selected on) and test values
    trials = sweep.trials()         # a typed record per trial; .to_pandas(): export's table
    model = sweep.best_model()      # the registered model: model.predict(["some text"])

Each method imports what it uses when it runs, so that reading a sweep (``status``, ``list``)
loads no PyTorch, MLflow or Ray; :func:`load` imports a verb's modules ahead of it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from seqae_errors import ConfigError
from sweeps.stores.ownership import actor, check
from sweeps.stores.workspace import Job, Listed, Submission, Workspace, listing

if TYPE_CHECKING:
    from sweeps.results.eta import Eta
    from sweeps.results.export import Trials
    from sweeps.results.plan import Forecast
    from sweeps.results.status import SweepStatus
    from sweeps.results.watch import View
    from sweeps.running.lifecycle import Checked, TrialStop
    from sweeps.spec.sections import Distribution
    from sweeps.stores.control_channel import Control
    from sweeps.stores.deletion import Deletion, Purged
    from sweeps.stores.queue import Place
    from sweeps.stores.shares import Quota
    from sweeps.stores.textmodel import LoadedModel

BACKENDS = ("storage", "mlflow_tracking_uri", "optuna_storage")  # what ``backends=`` may name
# What each kind of verb imports when it first runs, for :func:`load`.
MODULES = {
    "drive": ("sweeps.running.driver", "sweeps.running.lifecycle", "sweeps.running.submit", "dashboards.report.page"),
    "read": ("sweeps.results.status",),
    "tables": ("sweeps.results.export", "dashboards.compare", "dashboards.report.page"),
    "cluster": ("sweeps.running.submit", "sweeps.results.remote_status"),
    "models": ("sweeps.results.registry",),
    "plan": ("sweeps.results.plan",),
}


def load(kind: str) -> None:
    """Import now what the verbs of ``kind`` (a key of :data:`MODULES`) import on first use: a
    process that ends with its verb (the command line's) then freezes them out of the garbage
    collector's view."""
    for module in MODULES[kind]:
        importlib.import_module(module)


def show_progress() -> None:
    """Print the driver's progress lines (each trial's epochs, the session's end) on standard
    output from now on, as ``seqae sweep run`` does."""
    from sweeps.running import progress

    progress.show()


@dataclass(frozen=True)
class Pending:
    """A sweep submitted to a cluster whose driver has not yet created its study: only its job."""

    name: str
    job: Job
    owner: str | None  # who submitted it (None: a submission from before owners)

    def as_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Encoding:
    """One text through a registered model: its tokens, their reconstruction from the latents."""

    tokens: list[str]
    reconstructed_tokens: list[str]
    token_accuracy: float
    latent_shape: tuple[int, ...]


@dataclass(frozen=True)
class Encoded:
    model_uri: str  # the registry version that encoded them, models:/NAME/VERSION
    texts: list[Encoding]


class Sweep:
    """Sweep ``name`` in ``workspace`` (a folder; unset: ``$SEQAE_WORKSPACE``, else ``./seqae-runs``):
    one this workspace holds, or one submitted from it to a cluster. Opening an unknown sweep is
    refused. ``exit_code`` is what its last run, resume or extend in this process ended with, as
    the command line would exit: 0 when it completed or was stopped, else the driver's code for an
    interrupted sweep (it continues with :meth:`resume`)."""

    def __init__(self, name: str, workspace: str | Path | Workspace | None = None) -> None:
        self.workspace = _workspace(workspace)
        self.submission: Submission | None = self.workspace.read_submission(name)
        if self.submission is None:
            self.workspace.known(name)  # an unknown sweep is refused, naming it (its record is read where it is used)
        self.name = name
        self.exit_code: int | None = None

    def __repr__(self) -> str:
        return f"Sweep({self.name!r}, workspace={str(self.workspace.root)!r})"

    @classmethod
    def open(cls, name: str, workspace: str | Path | Workspace | None = None) -> Sweep:
        return cls(name, workspace)

    @classmethod
    def create(
        cls,
        file: str | Path,
        *,
        set: Sequence[str] = (),
        profile: str | None = None,
        name: str | None = None,
        workspace: str | Path | Workspace | None = None,
        or_resume: bool = False,
        backends: dict[str, str | None] | None = None,
    ) -> Sweep:
        """Check sweep ``file`` with its ``profile`` and ``set`` overrides (``"key=value"``, as
        ``--set``) and record it, without running it; ``backends`` may name ``storage``,
        ``mlflow_tracking_uri`` and ``optuna_storage`` (else the workspace's own). With ``or_resume``
        an existing sweep of that name is taken if the file still describes it."""
        return cls._create(file, set, profile, name, workspace, or_resume, backends)[0]

    @classmethod
    def _create(
        cls,
        file: str | Path,
        set: Sequence[str],
        profile: str | None,
        name: str | None,
        workspace: str | Path | Workspace | None,
        or_resume: bool,
        backends: dict[str, str | None] | None,
    ) -> tuple[Sweep, Checked]:
        """:meth:`create`'s sweep, with what creating it checked, which its first session here need not check again."""
        from sweeps.running import lifecycle

        place = _workspace(workspace)
        sets = _sets(set, profile)
        overrides = dict.fromkeys(BACKENDS) | (backends or {})
        unknown = sorted(overrides.keys() - frozenset(BACKENDS))
        if unknown:
            raise ConfigError(f"backends: unknown key {unknown[0]!r}; choose from {', '.join(BACKENDS)}")
        checked = lifecycle.create(place, str(file), name, sets, overrides, or_resume=or_resume)
        return cls(checked.name, place), checked

    @classmethod
    def run(
        cls,
        file: str | Path,
        *,
        set: Sequence[str] = (),
        profile: str | None = None,
        name: str | None = None,
        workspace: str | Path | Workspace | None = None,
        or_resume: bool = False,
        backends: dict[str, str | None] | None = None,
        allow_code_change: bool = False,
        retry: str | None = None,
        verbose: bool = False,
    ) -> Sweep:
        """:meth:`create` the sweep, then run its trials here (on the Ray that ``RAY_ADDRESS``
        names, else a local one) until it ends; ``allow_code_change``: as for :meth:`resume`, for
        an existing sweep that ``or_resume`` takes. ``retry`` (``"3,5"``, or ``"failed"``: every
        failed one), with ``or_resume``: first give those failed trials of the existing sweep a new
        attempt, as :meth:`retry` does (the job that :meth:`retry` submits for a sweep on a cluster)."""
        if retry is not None and not or_resume:
            raise ConfigError(f"--retry {retry}: give --or-resume too; it retries failed trials of an existing sweep")
        sweep, checked = cls._create(file, set, profile, name, workspace, or_resume, backends)
        if retry is not None:
            return sweep._retry_here(None if retry == "failed" else retry, allow_code_change, verbose)
        return sweep._drive(check_file=False, verbose=verbose, allow_code_change=allow_code_change, checked=checked)

    @classmethod
    def fork(
        cls,
        origin: str,
        file: str | Path,
        *,
        set: Sequence[str] = (),
        profile: str | None = None,
        name: str | None = None,
        workspace: str | Path | Workspace | None = None,
        verbose: bool = False,
    ) -> Sweep:
        """A new sweep from ``file`` whose study starts with sweep ``origin``'s finished trials that
        fit its space, run until it ends. The fork is its maker's; ``origin`` is only read, as
        its status is, so it may be anyone's."""
        from sweeps.running import lifecycle

        place = _workspace(workspace)
        sweep = cls(lifecycle.fork(place, origin, str(file), name, _sets(set, profile), {}), place)
        return sweep._drive(check_file=False, verbose=verbose)

    @classmethod
    def submit(
        cls,
        file: str | Path,
        *,
        set: Sequence[str] = (),
        profile: str | None = None,
        name: str | None = None,
        address: str | None = None,
        workspace: str | Path | Workspace | None = None,
    ) -> Sweep:
        """Run the sweep on the Ray cluster whose dashboard ``address`` names (unset:
        ``$SEQAE_RAY_ADDRESS``) as a Ray Job, packaging the files git tracks in the current
        directory, the root of a seqae checkout, which must hold ``file``; checked here first. The
        sweep returned follows it: :meth:`job`, :meth:`logs`, :meth:`status`, :meth:`cancel`, :meth:`resume`."""
        from sweeps.running import submit

        place = _workspace(workspace)
        record = submit.submit(place, str(file), name, _sets(set, profile), address)
        return cls(record.name, place)

    def _drive(self, checked: Checked | None = None, **how: bool) -> Sweep:
        """Run the sweep's driver here until it ends; it calls the report handed to it as each session ends.
        ``checked``: what creating the sweep here just checked (:meth:`_create`)."""
        from dashboards.report import page
        from sweeps.results import eta
        from sweeps.running import driver

        with eta.publishing(self.workspace, self.name):  # its ETA in the cluster's queue while it runs
            self.exit_code = driver.drive(self.workspace, self.name, report=page.build, checked=checked, **how)
        return self

    def _submitted(self) -> Submission:
        if self.submission is None:
            raise ConfigError(f"sweep {self.name!r} was not submitted to a cluster from this workspace")
        return self.submission

    def _may(self, verb: str) -> str:
        """Who acts, if they may ``verb`` the sweep (its owner or MLflow's admin:
        :mod:`sweeps.stores.ownership`); refused otherwise."""
        record = self.submission or self.workspace.read(self.name)
        return check(self.name, record.owner, verb)

    def resume(self, *, allow_code_change: bool = False, verbose: bool = False) -> Sweep:
        """Run what is left of the sweep: interrupted trials from their newest checkpoint, then the
        trials not yet started. A submitted sweep is resubmitted, as a new job of the same sweep.
        A sweep whose code changed since its last session is refused unless ``allow_code_change``
        (a submitted one's job fails, saying so in its logs)."""
        self._may("resume")
        if self.submission is not None:
            from sweeps.running import submit

            submit.resubmit(self.workspace, self.submission, allow_code_change)
            self.exit_code = 0
            return self
        return self._drive(verbose=verbose, allow_code_change=allow_code_change)

    def extend(
        self,
        *,
        trials: int | str | None = None,
        epochs: int | None = None,
        which: str | None = None,
        allow_code_change: bool = False,
        verbose: bool = False,
    ) -> Sweep:
        """``trials`` more trials, or (with ``epochs``) the finished trials ``which`` names
        (``best:K`` or ``3,5``; unset: ``best:1``) trained on to ``epochs``; then run them."""
        from sweeps.running import driver, lifecycle, progress

        self._may("extend")
        if epochs is None and which is not None:
            raise ConfigError(f"extend: which={which!r} names trials to train on: give epochs=N too")
        if (trials is None) == (epochs is None):
            raise ConfigError("extend: give trials=N (more trials) or epochs=N (train finished trials on), not both")
        if trials is not None and not str(trials).isdigit():
            raise ConfigError(
                f"--trials={trials!r}: give how many trials to add (or --epochs N to train finished trials on)"
            )
        if self.submission is not None:
            # extend drives the sweep in this process: it would run the trials on a Ray of its own,
            # or find no sweep where the laptop's workspace is not the cluster's
            raise ConfigError(
                f"sweep {self.name!r} runs on a cluster as Ray jobs, and `extend` runs its driver here, not "
                f"as a job: extend it on the head, in its workspace {self.submission.workspace}, with "
                "RAY_ADDRESS set to the cluster's GCS address (HEAD:PORT, `ray start --head --port`)"
            )
        driver.check_code(self.workspace.read(self.name), allow_code_change)  # before the sweep is changed
        if epochs is not None:
            for note in lifecycle.extend_epochs(self.workspace, self.name, epochs, which or "best:1"):
                progress.say(f"seqae: {note}")
        else:
            lifecycle.extend(self.workspace, self.name, int(trials or 0))
        return self._drive(verbose=verbose, extending=epochs is not None, allow_code_change=allow_code_change)

    def stop(self, reason: str | None = None, now: bool = False) -> Control:
        """Start no new trials, wherever its driver runs; the running ones finish, or with ``now``
        stop at the end of their epoch, for a resume to continue them from there. ``reason`` is
        what its status shows (unset: ``stopped by USER from Python``); its control record's log
        names who stopped it. For its owner and MLflow's admin (:mod:`sweeps.stores.ownership`)."""
        from sweeps.running import lifecycle

        why = reason or f"stopped by {actor()} from Python"
        return lifecycle.control(self.workspace, self.name, drain=why, **({"now": True} if now else {}))

    def stop_trial(self, number: int, now: bool = False) -> TrialStop:
        """Stop trial ``number`` alone, wherever its driver runs: at its next validation, its records
        to there kept, or with ``now`` before its next optimizer step; it ends PRUNED, as a scheduler's stop
        ends a trial (COMPLETE had it reached its last epoch), in Optuna, Tune and MLflow, and its
        slot goes to the sweep's next trial. For its owner and MLflow's admin; a trial that is
        unknown or not running is refused, naming it."""
        from sweeps.running import lifecycle

        return lifecycle.stop_trial(self.workspace, self.name, number, now)

    def retry(
        self,
        trials: str | Sequence[int] | None = None,
        *,
        failed: bool = False,
        allow_code_change: bool = False,
        verbose: bool = False,
    ) -> Sweep:
        """Train failed trials again with their parameters, then run them here (a finished sweep is
        resumed for them alone): ``trials`` (``"3,5"`` or ``[3, 5]``), or with ``failed`` every
        failed one. Each gets a new attempt under its number, from the failed attempt's last good
        checkpoint where it kept one, else from scratch; the failed attempt stays readable (its
        Optuna record, its MLflow run with its error), linked to the new one. Refused while a
        driver runs the sweep; ``allow_code_change``: as for :meth:`resume` (a fix is often one).
        A sweep submitted to a cluster is resubmitted, as a new job of the same sweep whose driver
        retries them on the cluster (the trials it names are checked here first)."""
        from sweeps.running import lifecycle

        self._may("retry")
        if (trials is None) != failed:
            raise ConfigError(
                "retry: give trials=N,M (those failed trials) or failed=True (every failed trial), one of the two"
            )
        which = None if trials is None else trials if isinstance(trials, str) else ",".join(map(str, trials))
        if self.submission is not None:  # the driver runs as the cluster's job, where the sweep's state is
            from sweeps.running import submit

            lifecycle.check_retry(self.workspace, self.name, which)
            submit.resubmit(self.workspace, self.submission, allow_code_change, which or "failed")
            self.exit_code = 0
            return self
        return self._retry_here(which, allow_code_change, verbose)

    def _retry_here(self, which: str | None, allow_code_change: bool, verbose: bool) -> Sweep:
        """:meth:`retry`'s trials ``which`` (None: every failed one) given their new attempts, then
        run here."""
        from sweeps.running import driver, lifecycle, progress

        driver.check_code(self.workspace.read(self.name), allow_code_change)  # before the sweep is changed
        for note in lifecycle.retry(self.workspace, self.name, which):
            progress.say(f"seqae: {note}")
        return self._drive(verbose=verbose, extending=True, allow_code_change=allow_code_change)

    def set(self, **changes: int | str) -> Control:
        """Change the running sweep (:func:`check_changes`): ``max_concurrent=N`` from its
        driver's next trial on, wherever the driver runs. For its owner and MLflow's admin."""
        from sweeps.running import lifecycle

        return lifecycle.control(self.workspace, self.name, **check_changes(**changes))

    def delete(self, *, models: bool = False, dry_run: bool = False) -> Deletion:
        """Remove the sweep and everything it wrote (:mod:`sweeps.stores.deletion`): its folder and
        checkpoints, its Optuna study and queue row, its MLflow runs with their artifacts, its
        data-cache entries no other sweep uses; its registered model versions only with ``models``.
        ``dry_run``: only say what would go, and its size. Refused while its driver runs; for its
        owner and MLflow's admin."""
        from sweeps.stores import deletion

        return deletion.delete(self.workspace, self.name, models=models, dry_run=dry_run)

    def narrow(self, key: str, value: object) -> Distribution:
        """Narrow searched config ``key``'s space in place, from its driver's next proposal on,
        wherever the driver runs (:mod:`sweeps.stores.narrowing`): ``value`` the choices to keep
        (``[2, 4]``), a numeric range (``[1e-3, 3e-3]``) or a distribution (``{"low": ..., "high": ...}``);
        a wider one is refused (a fork's job). Trials already outside stay, marked in status.
        For its owner and MLflow's admin."""
        from sweeps.spec import sweep as spec_lib
        from sweeps.stores.search import read_only, study_exists

        if self.submission is not None and not self.workspace.exists(self.name):
            spec = spec_lib.load(self.submission.sweep_file, self.submission.sets)
            url = self.submission.backends.optuna_storage if self.submission.backends else ""
        else:
            state = self.workspace.read(self.name)
            spec, url = state.spec, state.backends.optuna_storage
        if not url or not study_exists(url, self.name):
            raise ConfigError(f"sweep {self.name!r} has not started yet: narrow its file instead")
        study = read_only(spec, url, self.name)
        who = check(self.name, study.owner or (self.submission or self.workspace.read(self.name)).owner, "narrow")
        return study.narrow(key.removeprefix("search."), value, who)

    def status(self) -> SweepStatus | Pending:
        """What ``seqae sweep status`` shows: trials by state, the best (validation and test), the
        cost against the budget, where its runs and study live (``.as_json()``: what ``--json``
        prints); a submitted sweep's job beside it, or only the job while its driver has not yet
        created the study."""
        import dataclasses

        from sweeps.results import status

        record = self.submission
        if record is None:
            return status.status(self.workspace, self.name)
        from sweeps.results import remote_status
        from sweeps.running import submit
        from sweeps.stores.search import study_exists

        if self.workspace.exists(self.name):  # its driver keeps its state in this workspace
            return dataclasses.replace(status.status(self.workspace, self.name), job=submit.job_info(record))
        if not (record.backends and study_exists(record.backends.optuna_storage, self.name)):
            return Pending(self.name, submit.job_info(record), record.owner)
        return remote_status.status_of(record)

    def watch(self, every: float = 5.0, timeout: float | None = None) -> View:
        """Watch the sweep until it ends (or ``timeout`` seconds): in a Jupyter notebook a table of
        its trials that updates in place every ``every`` seconds, elsewhere a line each time it
        changes and the table at the end (:mod:`sweeps.results.watch`). It reads the sweep's Optuna
        study alone, so it may watch a sweep of this workspace whose driver runs in another process,
        or one submitted to a cluster (through the stores its submission named, beside its job).
        Returns the last view (``.text()``)."""
        from sweeps.results import watch

        record = self.submission
        if record is None or self.workspace.exists(self.name):  # its driver keeps its state here
            look = watch.local(self.workspace, self.name)
        else:
            look = watch.submitted(record)
        return watch.watch(look, self.name, every, timeout)

    def eta(self) -> Eta:
        """The sweep's time left, from its own epochs so far (:func:`sweeps.results.eta.eta`)."""
        from sweeps.results import eta

        return eta.eta(self.workspace.read(self.name))

    def job(self) -> Job:
        """A submitted sweep's latest Ray Job, as the cluster reports it."""
        from sweeps.running import submit

        return submit.job_info(self._submitted())

    def logs(self) -> str:
        """What a submitted sweep's latest job printed so far."""
        from sweeps.running import submit

        return submit.logs(self._submitted())

    def cancel(self) -> bool:
        """Stop a submitted sweep's job (its trials continue from their checkpoints on
        :meth:`resume`); False if it had already ended. For its owner and MLflow's admin."""
        from sweeps.running import submit

        record = self._submitted()
        self._may("cancel")
        return submit.cancel(record)

    def trials(self) -> Trials:
        """Every trial as a typed record (:class:`sweeps.results.trials.Trial`), in number order;
        ``.to_pandas()`` is the table ``seqae sweep export`` writes."""
        from sweeps.results import export

        return export.trials(self.workspace, self.name)

    def export(self, out: str | Path | None = None, format: str | None = None) -> Path:
        """:meth:`trials` written to ``out`` as ``format`` (csv, parquet or jsonl; unset: what
        ``out``'s suffix names); an existing file is refused."""
        from sweeps.results import export

        return export.export(self.workspace, self.name, format, None if out is None else str(out))

    def best_model(self) -> LoadedModel:
        """The registered model of the sweep's best trial (alias ``@best``), built by the installed
        code from its stored weights and config (no code stored with it runs):
        ``.predict(["text", ...])`` gives each text's reconstruction and token accuracy."""
        from sweeps.results import registry

        return registry.load_registered(self.workspace.read(self.name).backends.mlflow_tracking_uri, self.name)[1]

    def compare(self, *others: str | Sweep, out: str | Path | None = None) -> tuple[str, Path]:
        """This sweep beside ``others`` (of the same objective, in the same workspace): the
        terminal's table and the written page."""
        from dashboards import compare

        names = [self.name, *(o.name if isinstance(o, Sweep) else o for o in others)]
        return compare.compare(self.workspace, names, None if out is None else str(out))

    def report(self) -> Path:
        """Write the sweep's report (also logged to its MLflow run); its ``index.html``."""
        from dashboards.report import page

        try:
            return page.build(self.workspace.read(self.name), self.workspace.report_dir(self.name))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def check_changes(**changes: int | str) -> dict[str, int]:
    """What :meth:`Sweep.set` may change, checked before any sweep is opened: ``max_concurrent``,
    a whole number (or its digits) from 1 to seqae's limit."""
    from sweeps.running import lifecycle

    return lifecycle.running_changes(**changes)


def plan(
    file: str | Path,
    *,
    set: Sequence[str] = (),
    profile: str | None = None,
    workspace: str | Path | Workspace | None = None,
    slots: int | None = None,
) -> Forecast:
    """What sweep ``file`` (with ``profile`` and ``set``, as :meth:`Sweep.run` takes them) will
    take, measured on this machine before anything runs (:func:`sweeps.results.plan.forecast`):
    trials, expected epochs, resource-hours, wall time at ``slots`` (else the share the cluster's
    queue would give it now, else what this machine holds), disk and MLflow rows. Only the data is
    prepared, into the workspace's cache, as a run would."""
    from sweeps.results import plan as planning
    from sweeps.spec import sweep as spec_lib

    spec = spec_lib.load(file, _sets(set, profile))
    place = _workspace(workspace)
    return planning.forecast(spec, place.cache_dir, slots, _queue_url(place))


def sweeps(workspace: str | Path | Workspace | None = None) -> list[Listed]:
    """Every sweep of ``workspace`` as ``seqae sweep list`` shows it, from the records alone."""
    return listing(_workspace(workspace))


def queue(workspace: str | Path | Workspace | None = None) -> list[Place]:
    """Every sweep on the cluster's database (``$SEQAE_OPTUNA_STORAGE``, else ``workspace``'s
    own), as ``seqae cluster queue`` shows it: its user, priority, state, the slots it holds, its
    share and its user's quota, trials done of total, its place in line; the running ones first."""
    from sweeps.stores.queue import Queue

    return Queue(_queue_url(_workspace(workspace)), create=False).view()


def set_priority(name: str, priority: int, workspace: str | Path | Workspace | None = None) -> Place:
    """Sweep ``name``'s priority on the cluster, from now on (its driver takes it within seconds;
    a higher one takes slots from lower ones at their trials' next validation). For its owner and
    MLflow's admin; anyone else is refused, naming the owner. The sweep is found in the cluster's
    queue, whichever workspace it was submitted from."""
    from sweeps.stores.queue import Queue

    place = _workspace(workspace)
    url = _queue_url(place, name)
    Queue(url).set_priority(name, priority)
    return next(p for p in Queue(url).view() if p.sweep == name)


def set_quota(
    user: str, cpus: float | None = None, gpus: float | None = None, workspace: str | Path | Workspace | None = None
) -> Quota:
    """``user``'s quota on the cluster: their sweeps together hold at most ``cpus`` CPUs and
    ``gpus`` GPUs at once (None: no limit); a sweep over it waits in the queue. For MLflow's admin."""
    from sweeps.stores.queue import Queue
    from sweeps.stores.shares import Quota

    for flag, value in (("--cpus", cpus), ("--gpus", gpus)):
        if value is not None and value < 0:
            raise ConfigError(f"{flag} {value}: a quota is zero or more")
    return Queue(_queue_url(_workspace(workspace))).set_quota(user, Quota(cpus, gpus))


def purge_deleted(backend_uri: str, tracking_uri: str) -> Purged:
    """For a tracking server's admin, with its database's credentials: purge the rows (and any
    artifact left) of the sweeps ``Sweep.delete`` deleted through the server at ``tracking_uri``
    (:func:`sweeps.stores.deletion.purge_marked`)."""
    from sweeps.stores import deletion

    return deletion.purge_marked(backend_uri, tracking_uri)


def _queue_url(workspace: Workspace, name: str | None = None) -> str:
    """The database of the cluster's queue: sweep ``name``'s Optuna storage where this workspace
    holds it, else ``$SEQAE_OPTUNA_STORAGE``, else the workspace's own."""
    if name is not None:
        record = workspace.read_submission(name)
        if record is not None and record.backends:
            return record.backends.optuna_storage
        if workspace.exists(name):
            return workspace.read(name).backends.optuna_storage
    return os.environ.get("SEQAE_OPTUNA_STORAGE") or workspace.default_backends("queue").optuna_storage


def encode(
    model: str, texts: Sequence[str], *, at: float | None = None, workspace: str | Path | Workspace | None = None
) -> Encoded:
    """``texts`` through registered ``model`` (``NAME``, ``NAME/VERSION`` or ``NAME@ALIAS``; with
    ``at``, the front's model of the largest latent share at most ``at``), from the registry of
    ``$SEQAE_MLFLOW_TRACKING_URI``, else of ``workspace``."""
    from sweeps.results.registry import load_registered

    if not texts:
        raise ConfigError("nothing to encode: give TEXT arguments, - for standard input, or --file PATH")
    for n, text in enumerate(texts, 1):
        if not text.strip():
            raise ConfigError(f"text {n} is empty: there is nothing to encode")
    uri, loaded = load_registered(_tracking_uri(_workspace(workspace), f"model {model!r}: "), model, at)
    rows = loaded.predict(list(texts))
    return Encoded(
        uri,
        [
            Encoding(list(r.tokens), list(r.reconstructed_tokens), float(r.token_accuracy), tuple(r.latents.shape))
            for r in rows.itertuples()
        ],
    )


def ui(
    *,
    host: str,
    mlflow_port: int,
    optuna_port: int,
    workspace: str | Path | Workspace | None = None,
    behind_auth_proxy: bool = False,
) -> None:
    """Serve the MLflow UI (unless ``$SEQAE_MLFLOW_TRACKING_URI`` names a server, which serves its
    own) and optuna-dashboard on ``workspace``'s stores until Ctrl-C, SIGTERM or SIGHUP; on a
    ``host`` other than loopback only ``behind_auth_proxy`` (neither UI has a login)."""
    from dashboards import ui as dashboards_ui
    from sweeps.stores.mlflow_access import check_credentials

    dashboards_ui.check_host(host, behind_auth_proxy)
    place = _workspace(workspace)
    tracking_uri = _tracking_uri(place, "")
    check_credentials(tracking_uri)  # the user's own, which the browser will ask for
    dashboards_ui.serve(
        tracking_uri,
        str(place.artifact_root),
        os.environ.get("SEQAE_OPTUNA_STORAGE", f"sqlite:///{place.root / 'optuna.db'}"),
        host,
        mlflow_port,
        optuna_port,
        place.root / "logs",
    )


def _tracking_uri(workspace: Workspace, what: str) -> str:
    """``$SEQAE_MLFLOW_TRACKING_URI``, else the workspace's own MLflow database, which a sweep
    must have created; ``what`` begins the refusal."""
    uri = os.environ.get("SEQAE_MLFLOW_TRACKING_URI")
    if uri is not None:
        return uri
    if not (workspace.root / "mlflow.db").exists():
        raise ConfigError(
            f"{what}no sweeps have run in {workspace.root} yet (no mlflow.db); pass --workspace, or "
            "set SEQAE_MLFLOW_TRACKING_URI"
        )
    return f"sqlite:///{workspace.root / 'mlflow.db'}"


def _workspace(workspace: str | Path | Workspace | None) -> Workspace:
    return workspace if isinstance(workspace, Workspace) else Workspace(workspace)


def _sets(overrides: Sequence[str], profile: str | None) -> list[str]:
    """The profile is the first override, so every ``set`` applies on top of it (as ``--profile``)."""
    return ([f"profile={profile}"] if profile else []) + list(overrides)
