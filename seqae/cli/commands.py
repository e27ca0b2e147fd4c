"""The verbs of the ``seqae`` command line, one function each: each calls :mod:`seqae.api` (or,
for ``train``, ``cluster`` and ``bench``, the package that verb is) and prints what it returns.

The sweep verbs import nothing of :mod:`sweeps`: the API imports what each verb uses when it
runs; the other verbs import their package when they run (the tree's other lazy imports,
each with its reason): `seqae train` and `--help` load no Ray or MLflow, and MLflow is imported
only after :func:`seqae.cli.main.main` has set its environment."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

from seqae import api
from seqae.api import Sweep
from seqae_core.metrics import duration_text, value_text
from seqae_errors import ConfigError


def _freeze_imported(kind: str) -> None:
    """Import what the verb's kind of API call uses (:func:`seqae.api.load`), then move those
    objects (torch's, MLflow's, Optuna's: hundreds of thousands, alive until exit) out of the
    garbage collector's view, whose full passes over them otherwise took as long again as reading
    a study of thousands of trials (``seqae bench control-plane``): this process ends with its verb."""
    api.load(kind)
    gc.freeze()


def _describe(sweep: Sweep) -> str:
    job, record = sweep.job(), sweep.submission
    assert record is not None  # a job is a submitted sweep's
    return (
        f"submitted sweep {sweep.name!r} as job {job.id} to {job.address}\n"
        f"  package: {record.package_files} files, {_size(record.package_bytes)} (the files git tracks in "
        f"{record.working_dir}, and the sweep file)\n"
        f"  watch:  {job.dashboard}\n"
        f"  logs:   seqae sweep logs {sweep.name}\n"
        f"  status: seqae sweep status {sweep.name}"
    )


def _size(n: int) -> str:
    return f"{n / 2**10:.1f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"


def _sets_file(path: str | None) -> list[str]:
    """The KEY=VALUE overrides in a JSON list (a submitted job's, which keeps them off its command line)."""
    if path is None:
        return []
    try:
        sets = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--sets-file {path}: {exc}") from None
    if not isinstance(sets, list) or not all(isinstance(s, str) and "=" in s for s in sets):
        raise ConfigError(f"--sets-file {path} must hold a JSON list of KEY=VALUE strings")
    return sets


def cmd_sweep_run(args: argparse.Namespace) -> int | None:  # the driver's exit code
    sets = _sets_file(args.sets_file) + args.set
    _freeze_imported("drive")
    backends = {"storage": args.storage, "mlflow_tracking_uri": args.mlflow_uri, "optuna_storage": args.optuna_storage}
    return Sweep.run(
        args.file,
        set=sets,
        profile=args.profile,
        name=args.name,
        workspace=args.workspace,
        or_resume=args.or_resume,
        backends=backends,
        allow_code_change=args.allow_code_change,
        retry=args.retry,
        verbose=args.verbose,
    ).exit_code


def cmd_sweep_resume(args: argparse.Namespace) -> int | None:  # the driver's exit code
    _freeze_imported("drive")
    sweep = Sweep(args.name, args.workspace).resume(allow_code_change=args.allow_code_change, verbose=args.verbose)
    if sweep.submission is not None:
        print(_describe(sweep))
    return sweep.exit_code


def cmd_sweep_submit(args: argparse.Namespace) -> int:
    _freeze_imported("cluster")
    sets = [
        *args.set,
        *(
            f"{key}={value}"
            for key, value in (("priority", args.priority), ("weight", args.weight))
            if value is not None
        ),
    ]
    sweep = Sweep.submit(
        args.file, set=sets, profile=args.profile, name=args.name, address=args.address, workspace=args.workspace
    )
    print(_describe(sweep))
    return 0


def cmd_sweep_logs(args: argparse.Namespace) -> int:
    _freeze_imported("cluster")
    print(Sweep(args.name, args.workspace).logs(), end="")
    return 0


def cmd_sweep_cancel(args: argparse.Namespace) -> int:
    _freeze_imported("cluster")
    sweep = Sweep(args.name, args.workspace)
    stopped = sweep.cancel()
    print(
        f"job {sweep.job().id}: {'stop requested' if stopped else 'already finished'}; "
        f"`seqae sweep resume {args.name}` continues it"
    )
    return 0


def cmd_sweep_fork(args: argparse.Namespace) -> int | None:  # the driver's exit code
    _freeze_imported("drive")
    return Sweep.fork(
        args.origin,
        args.file,
        set=args.set,
        profile=args.profile,
        name=args.name,
        workspace=args.workspace,
        verbose=args.verbose,
    ).exit_code


def cmd_sweep_stop(args: argparse.Namespace) -> int:
    if args.trial is not None:
        return _stop_trial(args)
    how = "`seqae sweep stop --now`" if args.now else "`seqae sweep stop`"
    Sweep(args.name, args.workspace).stop(f"stopped by {api.actor()} with {how}", now=args.now)
    running = "stop at the end of their epoch" if args.now else "finish"
    print(
        f"sweep {args.name}: no new trials start; the running ones {running}. `seqae sweep resume {args.name}` "
        "continues it later"
    )
    return 0


def _stop_trial(args: argparse.Namespace) -> int:
    stop = Sweep(args.name, args.workspace).stop_trial(args.trial, now=args.now)
    when = (
        "now, before its next step (what it trained since its last validation is lost)"
        if stop.now
        else "at its next validation, keeping its record to there"
    )
    where = (
        "; no driver runs the sweep now: its next resume records it"
        if stop.driving is False
        else ""
        if stop.driving
        else "; its job's driver reads it"
    )
    print(
        f"sweep {args.name}: trial {args.trial} stops {when}; it ends pruned, as a scheduler's stop ends a trial "
        f"(complete had it reached its last epoch), and its slot goes to the sweep's next trial{where}"
    )
    return 0


def cmd_sweep_retry(args: argparse.Namespace) -> int | None:  # the driver's exit code
    _freeze_imported("drive")
    sweep = Sweep(args.name, args.workspace).retry(
        args.trials, failed=args.failed, allow_code_change=args.allow_code_change, verbose=args.verbose
    )
    if sweep.submission is not None:
        print(_describe(sweep))
    return sweep.exit_code


def cmd_sweep_set(args: argparse.Namespace) -> int:
    key, _, value = args.change.partition("=")
    if key.startswith("search."):
        from seqae_core.config import parse_sets

        new = Sweep(args.name, args.workspace).narrow(key, parse_sets([args.change])[key])
        print(
            f"sweep {args.name}: {key} narrowed to {new.model_dump()} from its next proposal on (recorded in its "
            "study); trials already outside stay in its history, marked in its status"
        )
        return 0
    changes = api.check_changes(**{key: value})  # a mistake is refused before the sweep is read
    control = Sweep(args.name, args.workspace).set(**changes)
    print(f"sweep {args.name}: max_concurrent={control.max_concurrent} from its next trial on (recorded in its study)")
    return 0


def cmd_sweep_delete(args: argparse.Namespace) -> int:
    done = Sweep(args.name, args.workspace).delete(models=args.models, dry_run=args.dry_run)
    verb = "would remove" if done.dry_run else "removed"
    print(f"sweep {done.name}: {verb} {done.files:,} files, {_size(done.bytes)}, and the rows below")
    for part in done.removed:
        print("  " + _part(part))
    for part in done.kept:
        print("  kept: " + _part(part))
    if done.pending:
        print(f"  left: {done.pending}")
    return 0


def _part(part: Any) -> str:
    """A line of `sweep delete`: what, how many (its note), its files and bytes, where."""
    size = f"{part.files:,} file{'' if part.files == 1 else 's'}, {_size(part.bytes)}" if part.files else ""
    return f"{part.what:<26} {'; '.join(x for x in (part.note, size) if x)}  ({part.where})"


def cmd_sweep_priority(args: argparse.Namespace) -> int:
    place = api.set_priority(args.name, args.priority, args.workspace)
    print(
        f"sweep {args.name}: priority {place.priority} (its driver takes it within seconds; {place.state}, "
        f"share {place.share} slots)"
    )
    return 0


def cmd_cluster_queue(args: argparse.Namespace) -> int:
    import dataclasses

    places = api.queue(args.workspace)
    if args.json:
        print(json.dumps([dataclasses.asdict(p) for p in places]))
        return 0
    print(_queue_table(places))
    return 0


def _queue_table(places: list[Any]) -> str:
    """`seqae cluster queue`'s table: a row per sweep."""
    if not places:
        return "no sweep has run on this cluster's database yet"
    header = (
        "SWEEP",
        "USER",
        "PRIORITY",
        "WEIGHT",
        "STATE",
        "HELD/SHARE/QUOTA",
        "WAITING",
        "PAUSED",
        "TRIALS",
        "IN LINE",
        "ETA",
    )
    rows = [header]
    for p in places:
        quota = (
            "/".join(f"{v:g} {unit}" for v, unit in ((p.quota.cpus, "CPUs"), (p.quota.gpus, "GPUs")) if v is not None)
            or "-"
        )
        share = f"{p.held}/{p.share}/{quota}" + (f" ({p.why})" if p.why and p.state not in ("done", "stopped") else "")
        rows.append(
            (
                p.sweep,
                p.user,
                str(p.priority),
                f"{p.weight:g}",
                p.state,
                share,
                str(p.waiting),
                str(p.paused),
                f"{p.trials_done}/{p.trials_total}",
                str(p.place or "-"),
                "-" if p.eta_seconds is None else duration_text(p.eta_seconds),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def cmd_cluster_quota(args: argparse.Namespace) -> int:
    quota = api.set_quota(args.user, args.cpus, args.gpus, args.workspace)
    limits = ", ".join(f"{v:g} {unit}" for v, unit in ((quota.cpus, "CPUs"), (quota.gpus, "GPUs")) if v is not None)
    print(
        f"{args.user}'s sweeps hold at most {limits or 'anything (no limit)'} at once; a sweep over it waits in "
        "the queue"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    _freeze_imported("tables")
    index = Sweep(args.name, args.workspace).report()
    print(f"report: {index}  (also logged to the sweep's MLflow run, under report/)")
    return 0


def _texts(args: argparse.Namespace) -> list[str]:
    """The TEXT arguments (``-``: standard input, read once), then each ``--file``'s text; a file
    that cannot be read is refused in one line."""
    texts = [sys.stdin.read() if text == "-" else text for text in args.texts]
    for path in args.file:
        try:
            texts.append(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(
                f"--file {path}: cannot read it as UTF-8 text ({e.strerror if isinstance(e, OSError) else e.reason})"
            ) from None
    return texts


def cmd_encode(args: argparse.Namespace) -> int:
    from seqae_core.checkpoint import marked  # torch, only for `seqae encode` and `seqae train`
    from seqae_core.data import detokenize  # numpy and torch, only for `seqae encode`

    encoded = api.encode(args.model, _texts(args), at=args.at, workspace=args.workspace)
    print(f"{encoded.model_uri}: each text's reconstruction from its latents, wrong tokens [[marked]]")
    for n, text in enumerate(encoded.texts, 1):
        print(
            f"\ntext {n}: token accuracy {text.token_accuracy:.4f} ({len(text.tokens)} tokens, "
            f"latents {' x '.join(map(str, text.latent_shape))})"
        )
        print("  original:      " + detokenize(text.tokens))
        print("  reconstructed: " + marked(text.tokens, text.reconstructed_tokens))
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    api.ui(
        host=args.host,
        mlflow_port=args.mlflow_port,
        optuna_port=args.optuna_port,
        workspace=args.workspace,
        behind_auth_proxy=args.behind_auth_proxy,
    )
    return 0


def cmd_cluster_up(args: argparse.Namespace) -> int:
    from cluster import local  # the cluster's processes, only for `seqae cluster`

    root = Path(args.dir)
    if args.cluster_command == "services":
        print(f"starting PostgreSQL and MLflow in {root.resolve()} ...", flush=True)
        state = local.up(root, ray=False, storage=args.storage)
    else:
        gpus = "" if args.gpus_per_worker is None else f" with {args.gpus_per_worker} GPUs each"
        print(
            f"starting a Ray head and {args.workers} workers{gpus}, PostgreSQL and MLflow in {root.resolve()} ...",
            flush=True,
        )
        state = local.up(
            root,
            args.workers,
            args.cpus_per_worker,
            args.head_cpus,
            gpus_per_worker=args.gpus_per_worker,
            pass_env=tuple(args.pass_env),
        )
    env = local.environment(state)
    if state.ray:
        print(f"Ray dashboard   {env['SEQAE_RAY_ADDRESS']}  (token in {state.token_file})")
    print(
        f"MLflow          {env['SEQAE_MLFLOW_TRACKING_URI']}  (user {env['MLFLOW_TRACKING_USERNAME']}, password in "
        f"{state.mlflow.password_file})"
    )
    print(f"Optuna          {env['SEQAE_OPTUNA_STORAGE']}  (password in {env['PGPASSFILE']})")
    print(f"storage         {env['SEQAE_STORAGE']}")
    if state.ray and state.pass_env:
        print(f"nodes also get  {', '.join(state.pass_env)}  (--pass-env)")
    print(f"\nto submit sweeps to it, export:\n  source {root.resolve() / 'env.sh'}")
    return 0


def cmd_cluster_down(args: argparse.Namespace) -> int:
    from cluster import local  # the cluster's processes, only for `seqae cluster`

    stopped = local.down(Path(args.dir))
    print("stopped: " + (", ".join(stopped) or "nothing was running"))
    return 0


def cmd_cluster_check_launcher(args: argparse.Namespace) -> int:
    from cluster import launcher

    for file in args.files:
        launcher.check(Path(file))
        print(f"{file}: no placeholders left")
    return 0


def cmd_cluster_add_user(args: argparse.Namespace) -> int:
    from cluster import local  # the cluster's processes, only for `seqae cluster`

    folder, tunnel = local.add_user(Path(args.dir), args.user)
    print(
        f"MLflow user {args.user!r} created; their password, the Ray token and the studies' pgpass are in {folder} "
        f"(mode 600). Give them that folder; on their machine: {tunnel} (the dashboard, MLflow and PostgreSQL, "
        f"on the head's loopback), then source {folder.name}/env.sh"
    )
    return 0


def cmd_cluster_gc(args: argparse.Namespace) -> int:
    from cluster import local  # the cluster's processes, only for `seqae cluster`

    store = local.mlflow_store(Path(args.dir))
    saved = {k: os.environ.get(k) for k in store.env}
    os.environ.update(store.env)  # MLflow's role and admin, for the purge only: MLflow reads them from here
    try:
        purged = api.purge_deleted(store.backend_uri, store.tracking_uri)
    finally:
        for key, value in saved.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value
    print(f"purged from {store.backend_uri}, what `seqae sweep delete` marked deleted:")
    print(f"  runs           {purged.runs:,}  (their metrics, params, tags, dataset links and any artifact left)")
    print(f"  logged models  {purged.logged_models:,}")
    print(f"  experiments    {purged.experiments:,}")
    return 0


def cmd_cluster_status(args: argparse.Namespace) -> int:
    from cluster import local  # the cluster's processes, only for `seqae cluster`

    info = local.status(Path(args.dir))
    print(json.dumps(info, indent=1))
    return 0 if all(info["services"].values()) else 1


def cmd_sweep_extend(args: argparse.Namespace) -> int | None:  # the driver's exit code
    _freeze_imported("drive")
    sweep = Sweep(args.name, args.workspace)
    # --trials is how many more trials, or with --epochs which finished ones train on
    trials, which = (None, args.trials) if args.epochs is not None else (args.trials, None)
    return sweep.extend(
        trials=trials, epochs=args.epochs, which=which, allow_code_change=args.allow_code_change, verbose=args.verbose
    ).exit_code


def cmd_sweep_status(args: argparse.Namespace) -> int:
    _freeze_imported("read")
    sweep = Sweep(args.name, args.workspace)
    info = sweep.status()
    if args.json:
        print(json.dumps(info.as_json()))
        return 0
    if isinstance(info, api.Pending):
        owner = f" by {info.owner}" if info.owner else ""
        print(
            f"sweep {args.name} (submitted{owner}): job {info.job.id} is {info.job.status} (its driver has not "
            "started its trials yet)"
        )
        return 0
    print(f"sweep {info.name} ({info.outcome}) in {info.workspace}")
    if info.owner:
        print(f"  owner: {info.owner}")
    if info.profile:
        print(f"  profile: {info.profile}: {info.description}")
    control = info.control
    if control.drain:
        running = "; the running ones stop at the end of their epoch" if control.now else ""
        print(f"  {'stopping' if info.outcome == 'running' else 'stopped'}: no new trials ({control.drain}){running}")
    if control.max_concurrent:
        when = next(e["at"] for e in reversed(control.log) if "max_concurrent" in e)
        print(f"  max_concurrent: {control.max_concurrent} (set {when})")
    if info.forked_from:
        print(f"  forked from {info.forked_from}: {info.seeded_trials} of its trials seeded the study")
    print(f"  trials: {info.trials_total} planned; " + ", ".join(f"{k} {v}" for k, v in info.trials_by_state.items()))
    if sweep.workspace.exists(sweep.name):  # its driver's records are here
        print(f"  {sweep.eta().line()}")
    if info.queue is not None and info.queue.state not in ("done", "stopped"):
        q = info.queue
        line = (
            f"{q.place}{'st' if q.place == 1 else 'nd' if q.place == 2 else 'rd' if q.place == 3 else 'th'} in line"
            if q.place
            else f"holds {q.held} slots"
        )
        print(
            f"  cluster queue: {q.state}, priority {q.priority}, {line}; its share {q.share} slots"
            + (f" ({q.why})" if q.why else "")
            + ("" if q.eta_seconds is None else f"; ETA {duration_text(q.eta_seconds)} (its driver's)")
        )
    if info.proposed_by:
        print("  proposed by: " + ", ".join(f"{k} {v}" for k, v in info.proposed_by.items()))
    for start, trial in info.starts.items():
        value = "".join(f", {k} {value_text(v, trial.seeds or {}, k)}" for k, v in trial.values.items())
        print(f"  start {start}: trial {trial.number} ({trial.state}{value})")
    for note in info.notes:
        print(f"  note: {note}")
    if info.attempts:
        print(
            "  attempts: "
            + ", ".join(f"trial {n} took {k}" for n, k in info.attempts.items())
            + " (`seqae sweep retry`); every other trial took 1"
        )
    cost = info.cost
    budget = f" of a budget of {cost.budget:g}" if cost.budget else ""
    print(f"  cost: {cost.hours:.4f} {cost.unit}{budget}")
    for entry in info.best:
        seeds = entry.seeds or {}
        values = ", ".join(f"{k} {value_text(v, seeds, k, seeds=True)}" for k, v in entry.values.items())
        test = ", ".join(f"{k} {value_text(v, seeds, k, seeds=True)}" for k, v in (entry.test or {}).items())
        start = f" (start {entry.start})" if entry.start else ""
        print(f"  best: trial {entry.number}{start}: {values} (validation, selected on)")
        print(
            f"        {f'{test} (test pages, never selected on)' if test else 'no test split: data.test_fraction is 0'}"
        )
        for key, value in sorted(entry.params.items()):
            print(f"        {key} = {value}")
    print(
        f"  MLflow: {info.mlflow_tracking_uri} experiment {info.mlflow_experiment_id}, "
        f"sweep run {info.mlflow_parent_run_id}"
    )
    print(f"  Optuna: {info.optuna_storage} study {info.optuna_study_name}")
    if info.job:
        print(f"  job: {info.job.id} {info.job.status} ({info.job.dashboard})")
    return 0


def cmd_sweep_export(args: argparse.Namespace) -> int:
    _freeze_imported("tables")
    print(f"wrote {Sweep(args.name, args.workspace).export(args.out, args.format)}")
    return 0


def cmd_sweep_compare(args: argparse.Namespace) -> int:
    _freeze_imported("tables")
    first, *others = args.names
    text, page = Sweep(first, args.workspace).compare(*others, out=args.out)
    print(text)
    print(f"\npage: {page}")
    return 0


def cmd_sweep_plan(args: argparse.Namespace) -> int:
    _freeze_imported("plan")
    forecast = api.plan(args.file, set=args.set, profile=args.profile, workspace=args.workspace, slots=args.slots)
    if args.json:
        print(json.dumps(dataclasses.asdict(forecast)))
        return 0
    print(f"plan of {args.file}")
    for line in forecast.lines():
        print(f"  {line}")
    return 0


def cmd_sweep_list(args: argparse.Namespace) -> int:
    rows = api.sweeps(args.workspace)
    if not rows:
        print("no sweeps in this workspace")
    for row in rows:
        states = ", ".join(f"{k} {v}" for k, v in row.by_state.items())
        print(f"{row.name:24s} {row.outcome:12s} {row.trials:4d} trials  {states}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from benchmarks.run import command  # torch and the benchmarks, only for `seqae bench`

    command(args)
    return 0


def check_device(device: str | None) -> None:
    """Refuse, naming it, a CUDA device this torch cannot use: torch's own error is a traceback
    ("Torch not compiled with CUDA enabled") at the first tensor moved there."""
    import torch

    if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"--device={device!r}: this PyTorch ({torch.__version__}) sees no CUDA GPU "
            "(torch.cuda.is_available() is False); install a CUDA build of PyTorch (README: Install) "
            "or pass --device cpu"
        )


def cmd_train(args: argparse.Namespace) -> int:
    from seqae_core import config as config_lib  # torch, only for `seqae train`
    from seqae_core import train as train_lib  # torch, only for `seqae train`
    from seqae_core.checkpoint import Checkpoint, CheckpointStore  # torch, only for `seqae encode` and `seqae train`
    from seqae_core.epoch import EpochRecord  # beside the trainer that makes it

    config = config_lib.load(args.config, args.set)
    check_device(args.device)
    store, resume = None, None
    if args.resume and not args.checkpoint_dir:
        raise ConfigError("--resume needs --checkpoint-dir")
    if args.checkpoint_dir:
        store = CheckpointStore(args.checkpoint_dir)
        resume, skipped = store.resume()
        for note in skipped:
            print(f"seqae: skipped checkpoint {note}", file=sys.stderr)
        if resume is not None and not args.resume:
            raise ConfigError(
                f"--checkpoint-dir {args.checkpoint_dir} already holds a run (epoch {resume.epoch}); "
                "pass --resume to continue it, or choose another folder"
            )
        if args.resume:
            print(
                f"seqae: resuming {resume.place}"
                if resume
                else "seqae: no valid checkpoint found; starting from epoch 1",
                file=sys.stderr,
            )

    def report(record: EpochRecord, checkpoint: Checkpoint) -> None:
        if store is not None:
            store.save(record, checkpoint)
        print(
            f"epoch {record.epoch}: train_loss {record.train_loss:.4f}  val_loss {record.val_loss:.4f}  "
            f"val_token_accuracy {record.val_token_accuracy:.4f}  "
            f"val_sequence_accuracy {record.val_sequence_accuracy:.4f}  "
            f"{record.tokens_per_s:.0f} tokens/s",
            flush=True,
        )

    final = train_lib.train(config, report, resume=resume, device=args.device, cache_dir=args.cache_dir, progress=True)
    if args.json:
        print(json.dumps(final))
    else:
        print("final: " + "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in final.items()))
    return 0
