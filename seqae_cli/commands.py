"""The verbs of the ``seqae`` command line, one function each.

Each verb imports what it needs when it runs (the only lazy imports of the tree, each with its
reason): `seqae train` and `--help` load no Ray or MLflow, and MLflow is imported only after
:func:`seqae_cli.main.main` has set its environment."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any

from seqae_core.metrics import value_text
from seqae_errors import ConfigError
from sweeps.workspace import Submission, Workspace, listing


def _workspace(args: argparse.Namespace) -> Workspace:
    return Workspace(args.workspace)


def _freeze_imported_objects() -> None:
    """Called by a verb that reads or drives a sweep once its imports are done: their objects
    (torch's, MLflow's, Optuna's: hundreds of thousands, alive until exit) leave the garbage
    collector's view, whose full passes over them otherwise took as long again as reading a
    study of thousands of trials (``seqae bench control-plane``)."""
    gc.freeze()


def _sets(args: argparse.Namespace) -> list[str]:
    """``--profile NAME`` is the first override, so every ``--set`` applies on top of the profile."""
    return ([f"profile={args.profile}"] if args.profile else []) + args.set


def cmd_sweep_run(args: argparse.Namespace) -> int | None:  # the driver's exit code
    from sweeps.api import Sweep  # Ray, MLflow and torch, only for the verbs that drive a sweep

    _freeze_imported_objects()
    backends = {"storage": args.storage, "mlflow_tracking_uri": args.mlflow_uri, "optuna_storage": args.optuna_storage}
    return Sweep.run(args.file, set=args.set, profile=args.profile, name=args.name, workspace=args.workspace,
                     or_resume=args.or_resume, backends=backends, verbose=args.verbose).exit_code


def cmd_sweep_resume(args: argparse.Namespace) -> int | None:  # the driver's exit code
    from sweeps import submit  # Ray's Jobs client, only for a cluster's verbs
    from sweeps.api import Sweep  # Ray, MLflow and torch, only for the verbs that drive a sweep

    _freeze_imported_objects()
    workspace = _workspace(args)
    record = workspace.read_submission(args.name)
    if record is not None:
        submit.resubmit(workspace, record)
        print(submit.describe(record))
        return 0
    return Sweep(args.name, workspace).resume(allow_code_change=args.allow_code_change, verbose=args.verbose).exit_code


def _record(args: argparse.Namespace) -> Submission:

    record = _workspace(args).read_submission(args.name)
    if record is None:
        raise ConfigError(f"sweep {args.name!r} was not submitted to a cluster from this workspace")
    return record


def cmd_sweep_submit(args: argparse.Namespace) -> int:
    from sweeps import submit  # Ray's Jobs client, only for a cluster's verbs

    record = submit.submit(_workspace(args), args.file, args.name, _sets(args), args.address)
    print(submit.describe(record))
    return 0


def cmd_sweep_logs(args: argparse.Namespace) -> int:
    from sweeps import submit  # Ray's Jobs client, only for a cluster's verbs

    print(submit.logs(_record(args)), end="")
    return 0


def cmd_sweep_cancel(args: argparse.Namespace) -> int:
    from sweeps import submit  # Ray's Jobs client, only for a cluster's verbs

    record = _record(args)
    stopped = submit.cancel(record)
    print(f"job {record.jobs[-1]}: {'stop requested' if stopped else 'already finished'}; "
          f"`seqae sweep resume {args.name}` continues it")
    return 0


def cmd_sweep_fork(args: argparse.Namespace) -> int | None:  # the driver's exit code
    from sweeps.api import Sweep  # Ray, MLflow and torch, only for the verbs that drive a sweep

    _freeze_imported_objects()
    return Sweep.fork(args.origin, args.file, set=args.set, profile=args.profile, name=args.name, workspace=args.workspace,
                      verbose=args.verbose).exit_code


def cmd_sweep_stop(args: argparse.Namespace) -> int:
    from sweeps import lifecycle  # Ray, Optuna and torch, only for the verbs that change a sweep

    how = "`seqae sweep stop --now`" if args.now else "`seqae sweep stop`"
    lifecycle.control(_workspace(args), args.name, drain=f"stopped by {how} on {socket.gethostname()}",
                      **({"now": True} if args.now else {}))
    running = "stop at the end of their epoch" if args.now else "finish"
    print(f"sweep {args.name}: no new trials start; the running ones {running}. `seqae sweep resume {args.name}` "
          "continues it later")
    return 0


def cmd_sweep_set(args: argparse.Namespace) -> int:
    from sweeps import lifecycle  # Ray, Optuna and torch, only for the verbs that change a sweep

    key, _, text = args.change.partition("=")
    if key != "max_concurrent":
        raise ConfigError(f"{args.change!r}: a running sweep can change max_concurrent=N only")
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"max_concurrent={text!r} must be a whole number of at least 1")
    lifecycle.control(_workspace(args), args.name, max_concurrent=int(text))
    print(f"sweep {args.name}: max_concurrent={text} from its next trial on (recorded in its study)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from sweeps.api import Sweep  # MLflow, and matplotlib as it draws, only to draw the report

    _freeze_imported_objects()
    index = Sweep(args.name, _workspace(args)).report()
    print(f"report: {index}  (also logged to the sweep's MLflow run, under report/)")
    return 0


def _texts(args: argparse.Namespace) -> list[str]:
    """The texts to encode: the arguments (``-``: standard input), then each ``--file``'s text;
    refused in one line when there are none, one is empty, or a file cannot be read."""
    texts = [sys.stdin.read() if text == "-" else text for text in args.texts]
    for path in args.file:
        try:
            texts.append(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--file {path}: cannot read it as UTF-8 text "
                              f"({e.strerror if isinstance(e, OSError) else e.reason})") from None
    if not texts:
        raise ConfigError("nothing to encode: give TEXT arguments, - for standard input, or --file PATH")
    for n, text in enumerate(texts, 1):
        if not text.strip():
            raise ConfigError(f"text {n} is empty: there is nothing to encode")
    return texts


def cmd_encode(args: argparse.Namespace) -> int:
    from seqae_core.checkpoint import marked  # torch, only for `seqae encode` and `seqae train`
    from seqae_core.data import detokenize  # numpy and torch, only for `seqae encode`
    from sweeps.registry import load_registered  # MLflow, only for `seqae encode`

    texts = _texts(args)
    workspace = _workspace(args)
    uri = os.environ.get("SEQAE_MLFLOW_TRACKING_URI")
    if uri is None:
        if not (workspace.root / "mlflow.db").exists():
            raise ConfigError(f"model {args.model!r}: no sweeps have run in {workspace.root} yet (no mlflow.db); "
                              "pass --workspace, or set SEQAE_MLFLOW_TRACKING_URI")
        uri = f"sqlite:///{workspace.root / 'mlflow.db'}"
    model_uri, model = load_registered(uri, args.model, args.at)
    out = model.predict(texts)
    print(f"{model_uri}: each text's reconstruction from its latents, wrong tokens [[marked]]")
    for n, row in enumerate(out.itertuples(), 1):
        print(f"\ntext {n}: token accuracy {row.token_accuracy:.4f} ({len(row.tokens)} tokens, "
              f"latents {' x '.join(map(str, row.latents.shape))})")
        print("  original:      " + detokenize(row.tokens))
        print("  reconstructed: " + marked(row.tokens, row.reconstructed_tokens))
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from dashboards import ui  # MLflow's server app, only for `seqae ui`
    from sweeps.mlflow_access import check_credentials  # MLflow, after main() set its environment

    workspace = _workspace(args)
    tracking_uri = os.environ.get("SEQAE_MLFLOW_TRACKING_URI", f"sqlite:///{workspace.root / 'mlflow.db'}")
    if tracking_uri.startswith("sqlite:") and not (workspace.root / "mlflow.db").exists():
        raise ConfigError(f"no sweeps have run in {workspace.root} yet (no mlflow.db)")
    check_credentials(tracking_uri)  # the user's own, which the browser will ask for
    ui.serve(
        tracking_uri,
        str(workspace.artifact_root),
        os.environ.get("SEQAE_OPTUNA_STORAGE", f"sqlite:///{workspace.root / 'optuna.db'}"),
        args.host, args.mlflow_port, args.optuna_port, workspace.root / "logs",
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
        print(f"starting a Ray head and {args.workers} workers{gpus}, PostgreSQL and MLflow in {root.resolve()} ...",
              flush=True)
        state = local.up(root, args.workers, args.cpus_per_worker, args.head_cpus, gpus_per_worker=args.gpus_per_worker)
    env = local.environment(state)
    if state["ray"]:
        print(f"Ray dashboard   {env['SEQAE_RAY_ADDRESS']}  (token in {state['token_file']})")
    print(f"MLflow          {env['SEQAE_MLFLOW_TRACKING_URI']}  (user {env['MLFLOW_TRACKING_USERNAME']}, password in "
          f"{state['mlflow']['password_file']})")
    print(f"Optuna          {env['SEQAE_OPTUNA_STORAGE']}  (password in {env['PGPASSFILE']})")
    print(f"storage         {env['SEQAE_STORAGE']}")
    print(f"\nto submit sweeps to it, export:\n  source {root.resolve() / 'env.sh'}")
    return 0


def cmd_cluster_down(args: argparse.Namespace) -> int:
    from cluster import local  # the cluster's processes, only for `seqae cluster`

    stopped = local.down(Path(args.dir))
    print("stopped: " + (", ".join(stopped) or "nothing was running"))
    return 0


def cmd_cluster_status(args: argparse.Namespace) -> int:
    from cluster import local  # the cluster's processes, only for `seqae cluster`

    info = local.status(Path(args.dir))
    print(json.dumps(info, indent=1))
    return 0 if all(info["services"].values()) else 1


def cmd_sweep_extend(args: argparse.Namespace) -> int | None:  # the driver's exit code
    from sweeps.api import Sweep  # Ray, MLflow and torch, only for the verbs that drive a sweep

    _freeze_imported_objects()
    sweep = Sweep(args.name, _workspace(args))
    if args.epochs is not None:
        return sweep.extend(epochs=args.epochs, which=args.trials or "best:1", allow_code_change=args.allow_code_change,
                            verbose=args.verbose).exit_code
    if args.trials is None or not args.trials.isdigit():
        raise ConfigError(f"--trials={args.trials!r}: give how many trials to add (or --epochs N to train finished "
                          "trials on)")
    return sweep.extend(trials=int(args.trials), allow_code_change=args.allow_code_change, verbose=args.verbose).exit_code


def cmd_sweep_status(args: argparse.Namespace) -> int:
    from sweeps import status  # Optuna, only to read a sweep

    workspace = _workspace(args)
    record = workspace.read_submission(args.name)
    if record is not None:
        # MLflow and Ray's Jobs client, only for a sweep submitted to a cluster: a local sweep's
        # status loads neither
        from sweeps import remote_status, submit
    _freeze_imported_objects()
    if record is not None and not workspace.exists(args.name):
        # submitted, and its driver keeps its state in the cluster's workspace: read its trials
        # from the backends the submission named, once its driver has created the study
        from sweeps.search import study_exists  # Optuna, only to read a sweep

        if not (record.backends and study_exists(record.backends.optuna_storage, args.name)):
            job = submit.job_info(record)
            print(json.dumps({"name": args.name, "job": job}) if args.json else f"sweep {args.name}: job {job['id']} "
                  f"is {job['status']} (its driver has not started its trials yet)")
            return 0
        info = remote_status.status_of(record)
    else:
        info = status.status(workspace, args.name)
        if record is not None:
            info = dataclasses.replace(info, job=submit.job_info(record))
    if args.json:
        print(json.dumps(info.as_json()))
        return 0
    print(f"sweep {info.name} ({info.outcome}) in {info.workspace}")
    if info.profile:
        print(f"  profile: {info.profile}: {info.description}")
    control = info.control
    if control.get("drain"):
        running = "; the running ones stop at the end of their epoch" if control.get("now") else ""
        print(f"  {'stopping' if info.outcome == 'running' else 'stopped'}: no new trials ({control['drain']}){running}")
    if control.get("max_concurrent"):
        when = next(e["at"] for e in reversed(control["log"]) if "max_concurrent" in e)
        print(f"  max_concurrent: {control['max_concurrent']} (set {when})")
    if info.forked_from:
        print(f"  forked from {info.forked_from}: {info.seeded_trials} of its trials seeded the study")
    print(f"  trials: {info.trials_total} planned; " + ", ".join(f"{k} {v}" for k, v in info.trials_by_state.items()))
    if info.proposed_by:
        print("  proposed by: " + ", ".join(f"{k} {v}" for k, v in info.proposed_by.items()))
    for start, trial in info.starts.items():
        value = "".join(f", {k} {value_text(v, trial.seeds or {}, k)}" for k, v in trial.values.items())
        print(f"  start {start}: trial {trial.trial} ({trial.state}{value})")
    for note in info.notes:
        print(f"  note: {note}")
    cost = info.cost
    budget = f" of a budget of {cost.budget:g}" if cost.budget else ""
    print(f"  cost: {cost.hours:.4f} {cost.unit}{budget}")
    best = info.best
    for entry in best if isinstance(best, list) else [best] if best else []:
        seeds = entry.seeds or {}
        values = ", ".join(f"{k} {value_text(v, seeds, k, seeds=True)}" for k, v in entry.values.items())
        test = ", ".join(f"{k} {value_text(v, seeds, k, seeds=True)}" for k, v in (entry.test or {}).items())
        start = f" (start {entry.start})" if entry.start else ""
        print(f"  best: trial {entry.trial}{start}: {values} (validation, selected on)")
        print(f"        {f'{test} (test pages, never selected on)' if test else 'no test split: data.test_fraction is 0'}")
        for key, value in sorted(entry.params.items()):
            print(f"        {key} = {value}")
    print(f"  MLflow: {info.mlflow_tracking_uri} experiment {info.mlflow_experiment_id}, "
          f"sweep run {info.mlflow_parent_run_id}")
    print(f"  Optuna: {info.optuna_storage} study {info.optuna_study_name}")
    if info.job:
        print(f"  job: {info.job['id']} {info.job['status']} ({info.job['dashboard']})")
    return 0


def cmd_sweep_export(args: argparse.Namespace) -> int:
    from sweeps import export  # MLflow, Optuna and pandas, only to read a sweep

    _freeze_imported_objects()
    table = export.export(_workspace(args), args.name, args.format, args.out)
    print(f"wrote {table}")
    return 0


def cmd_sweep_compare(args: argparse.Namespace) -> int:
    from sweeps.api import Sweep  # MLflow, Optuna, pandas and matplotlib, only to read sweeps

    _freeze_imported_objects()
    first, *others = args.names
    text, page = Sweep(first, _workspace(args)).compare(*others, out=args.out)
    print(text)
    print(f"\npage: {page}")
    return 0


def cmd_sweep_list(args: argparse.Namespace) -> int:
    rows = listing(_workspace(args))
    if not rows:
        print("no sweeps in this workspace")
    for row in rows:
        states = ", ".join(f"{k} {v}" for k, v in row["by_state"].items())
        print(f"{row['name']:24s} {row['outcome']:12s} {row['trials']:4d} trials  {states}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from benchmarks.run import SUITES  # torch and the benchmarks, only for `seqae bench`
    from benchmarks.run import main as run_benchmarks  # torch and the benchmarks, only for `seqae bench`

    if not args.suites:  # every suite together takes hours: a user names what to measure
        raise ConfigError(f"name the benchmark suites to run (seqae bench SUITE ...): {', '.join(SUITES)}")
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        raise ConfigError(f"unknown benchmark suite {unknown[0]!r}; choose from {', '.join(SUITES)}")
    if args.before and not (Path(args.before) / "seqae_cli" / "main.py").is_file():
        raise ConfigError(f"--before {args.before!r} is not a checkout of seqae (no seqae_cli/main.py there)")
    if "processes" in args.suites and not args.command:
        raise ConfigError("bench processes needs --command CMD: the command whose CPU-seconds it counts (for example .ci/run)")
    bounds = re.fullmatch(r"(\d+)(?:-(\d+))?", args.seeds)
    seeds = range(int(bounds[1]), int(bounds[2] or bounds[1]) + 1) if bounds else range(0)
    if not seeds:
        raise ConfigError(f"--seeds {args.seeds!r} is not a range FIRST-LAST of whole numbers (for example 0-999)")
    data = args.data or os.environ.get("SEQAE_BENCH_DATA") or "wikimedia/wikipedia"
    run_benchmarks(args.suites, Path(args.out),
                   {"shapes": args.shapes, "steps": args.steps, "workspace": args.workspace, "data": data,
                    "sizes": args.sizes, "optuna": args.optuna, "before": args.before, "seeds": seeds,
                    "fraction": args.fraction, "command": args.command})
    return 0


def check_device(device: str | None) -> None:
    """Refuse, naming it, a CUDA device this torch cannot use: torch's own error is a traceback
    ("Torch not compiled with CUDA enabled") at the first tensor moved there."""
    import torch

    if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device={device!r}: this PyTorch ({torch.__version__}) sees no CUDA GPU "
                          "(torch.cuda.is_available() is False); install a CUDA build of PyTorch (README: Install) "
                          "or pass --device cpu")


def cmd_train(args: argparse.Namespace) -> int:
    from seqae_core import config as config_lib  # torch, only for `seqae train`
    from seqae_core import train as train_lib  # torch, only for `seqae train`
    from seqae_core.checkpoint import Checkpoint, CheckpointStore  # torch, only for `seqae encode` and `seqae train`

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
            print(f"seqae: resuming after epoch {resume.epoch}" if resume else
                  "seqae: no valid checkpoint found; starting from epoch 1", file=sys.stderr)

    def report(metrics: dict[str, Any], checkpoint: Checkpoint) -> None:
        if store is not None:
            store.save(metrics, checkpoint)
        print(
            f"epoch {metrics['epoch']}: train_loss {metrics['train_loss']:.4f}  val_loss {metrics['val_loss']:.4f}  "
            f"val_token_accuracy {metrics['val_token_accuracy']:.4f}  "
            f"val_sequence_accuracy {metrics['val_sequence_accuracy']:.4f}  "
            f"{metrics['tokens_per_s']:.0f} tokens/s",
            flush=True,
        )

    final = train_lib.train(
        config, report, resume=resume, device=args.device, cache_dir=args.cache_dir, progress=True
    )
    if args.json:
        print(json.dumps(final))
    else:
        print("final: " + "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in final.items()))
    return 0

