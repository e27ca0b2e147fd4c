"""The ``seqae`` command line. Each command imports what it needs when it runs, so that
``seqae train`` never loads Ray or MLflow."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from seqae_errors import ConfigError

EXIT_USAGE = 2  # bad input: the same code argparse uses


def mlflow_environment() -> None:
    """seqae's MLflow client settings, unless the user set them, in the environment before
    anything imports MLflow (it reads its logging level at import) and before Ray starts (its
    workers inherit it): a failed request comes back to the writer's own retry loop quickly
    instead of blocking for minutes; no telemetry, no progress bars, no INFO chatter between the
    sweep's progress lines."""
    for key, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                       ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20"), ("MLFLOW_DISABLE_TELEMETRY", "true"),
                       ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"), ("MLFLOW_LOGGING_LEVEL", "WARNING")):
        os.environ.setdefault(key, value)


def main(argv: list[str] | None = None) -> int:
    # A shell that starts a command in the background makes it ignore SIGINT, and Python then
    # installs no KeyboardInterrupt for it; a sweep driver and `seqae ui` stop cleanly on SIGINT
    # (and SIGTERM, which they turn into one), wherever they were started from.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    mlflow_environment()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        return int(args.handler(args) or 0)
    except ConfigError as exc:
        print(f"seqae: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `seqae sweep status x | head`: the reader has what it wanted
        sys.stderr.close()
        return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqae", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train one model on a config")
    train.add_argument("--config", help="YAML file with data/model/train sections")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, e.g. --set model.latent_len=16 (repeatable)")
    train.add_argument("--json", action="store_true", help="print the final metrics as JSON on the last line")
    train.add_argument("--checkpoint-dir", help="save a checkpoint every epoch (folder or URI)")
    train.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint")
    train.add_argument("--cache-dir", help="tokenized data cache (default: $SEQAE_CACHE_DIR or ~/.cache/seqae/data)")
    train.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: CUDA when present)")
    train.set_defaults(handler=cmd_train)

    sweep = commands.add_parser("sweep", help="run and manage sweeps")
    sweeps = sweep.add_subparsers(dest="sweep_command", required=True)

    def with_workspace(p: argparse.ArgumentParser, verbose: bool = False) -> argparse.ArgumentParser:
        p.add_argument("--workspace", help="folder for sweeps, runs and studies (default: $SEQAE_WORKSPACE or "
                                           "./seqae-runs)")
        if verbose:
            p.add_argument("--verbose", action="store_true", help="also show Ray Tune's own status tables")
        return p

    run = with_workspace(sweeps.add_parser("run", help="start a sweep from a sweep file"), verbose=True)
    run.add_argument("file", help="sweep file, e.g. sweeps/studies/quickstart.yaml")
    run.add_argument("--name", help="the sweep's name (default: the file's name without .yaml)")
    run.add_argument("--or-resume", action="store_true",
                     help="if the sweep exists and the file still describes it, resume it")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key (pins it: it leaves the grid and search) or a sweep setting, "
                          "e.g. --set trials.total=4 (repeatable)")
    run.add_argument("--profile", help="apply the file's profile of that name first, e.g. --profile laptop")
    for flag, env, what in (("--storage", "SEQAE_STORAGE", "checkpoints and Tune state: a path every node reaches, "
                             "or a URI such as s3://bucket/prefix"),
                            ("--mlflow-uri", "SEQAE_MLFLOW_TRACKING_URI", "MLflow tracking URI"),
                            ("--optuna-storage", "SEQAE_OPTUNA_STORAGE", "Optuna storage URL")):
        run.add_argument(flag, help=f"{what} (default: ${env}, else inside the workspace)")
    run.set_defaults(handler=cmd_sweep_run)

    submit = with_workspace(sweeps.add_parser("submit", help="run a sweep on a Ray cluster, as a Ray Job"))
    submit.add_argument("file", help="sweep file inside the current directory, which is packaged for the cluster")
    submit.add_argument("--address", help="the cluster's dashboard URL, e.g. http://HEAD:8265 "
                                          "(default: $SEQAE_RAY_ADDRESS)")
    submit.add_argument("--name", help="the sweep's name (default: the file's name without .yaml)")
    submit.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for `sweep run`")
    submit.add_argument("--profile", help="as for `sweep run`")
    submit.set_defaults(handler=cmd_sweep_submit)

    for verb, text in (("logs", "the driver's output of a submitted sweep"),
                       ("cancel", "stop a submitted sweep (resume continues it)")):
        sub = with_workspace(sweeps.add_parser(verb, help=text))
        sub.add_argument("name")
        sub.set_defaults(handler=cmd_sweep_logs if verb == "logs" else cmd_sweep_cancel)

    forking = with_workspace(sweeps.add_parser("fork", help="a new sweep that starts from another's finished "
                                                            "trials that fit its space"), verbose=True)
    forking.add_argument("origin", help="the sweep whose finished trials seed the new one")
    forking.add_argument("--file", required=True, help="the new sweep's file (e.g. the origin's, narrowed)")
    forking.add_argument("--name", required=True, help="the new sweep's name")
    forking.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for `sweep run`")
    forking.add_argument("--profile", help="as for `sweep run`")
    forking.set_defaults(handler=cmd_sweep_fork)

    stop = with_workspace(sweeps.add_parser("stop", help="start no new trials; running ones finish (resume "
                                                         "continues the sweep later)"))
    stop.add_argument("name")
    stop.set_defaults(handler=cmd_sweep_stop)

    setting = with_workspace(sweeps.add_parser("set", help="change a running sweep: max_concurrent=N"))
    setting.add_argument("name")
    setting.add_argument("change", metavar="KEY=VALUE", help="max_concurrent=N: trials running at once from now on")
    setting.set_defaults(handler=cmd_sweep_set)

    resume = with_workspace(sweeps.add_parser("resume", help="continue an interrupted sweep (resubmits a "
                                                             "submitted one)"), verbose=True)
    resume.add_argument("name")
    resume.set_defaults(handler=cmd_sweep_resume)

    extend = with_workspace(sweeps.add_parser("extend", help="add trials to a sweep, using what it learned so far; "
                                                             "or, with --epochs, train finished trials on"),
                            verbose=True)
    extend.add_argument("name")
    extend.add_argument("--trials", help="how many trials to add; with --epochs, which trials train on: best:K "
                                         "(default best:1) or numbers, e.g. 3,5")
    extend.add_argument("--epochs", type=int, help="train the chosen finished trials on, from their last "
                                                   "checkpoint, to this many epochs")
    extend.set_defaults(handler=cmd_sweep_extend)

    status = with_workspace(sweeps.add_parser("status", help="trials by state, the best so far, where things are"))
    status.add_argument("name")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(handler=cmd_sweep_status)

    listing = with_workspace(sweeps.add_parser("list", help="the sweeps in a workspace"))
    listing.set_defaults(handler=cmd_sweep_list)

    report = with_workspace(commands.add_parser("report", help="build a sweep's HTML report and log it to MLflow"))
    report.add_argument("name")
    report.set_defaults(handler=cmd_report)

    encode = with_workspace(commands.add_parser("encode", help="run a registered model on texts: each one's "
                                                              "reconstruction, wrong tokens marked, token accuracy"))
    encode.add_argument("model", help="NAME (its newest version), NAME/VERSION, NAME@ALIAS or models:/NAME/VERSION, "
                                      "in the workspace's MLflow (or $SEQAE_MLFLOW_TRACKING_URI)")
    encode.add_argument("texts", nargs="+", metavar="TEXT", help="texts to encode and reconstruct")
    encode.set_defaults(handler=cmd_encode)

    ui = with_workspace(commands.add_parser("ui", help="the MLflow UI and optuna-dashboard on a workspace"))
    ui.add_argument("--host", default="127.0.0.1", help="address to serve on (default: 127.0.0.1)")
    ui.add_argument("--mlflow-port", type=int, default=5000, help="MLflow UI port (default: 5000)")
    ui.add_argument("--optuna-port", type=int, default=8080, help="optuna-dashboard port (default: 8080)")
    ui.set_defaults(handler=cmd_ui)

    cluster = commands.add_parser("cluster", help="a local multi-node Ray cluster with PostgreSQL and MLflow")
    clusters = cluster.add_subparsers(dest="cluster_command", required=True)
    for verb, text in (("up", "start a head and worker raylets on loopback, PostgreSQL and an MLflow server"),
                       ("services", "start only PostgreSQL and an MLflow server (beside a launcher's Ray head)"),
                       ("down", "stop what `up` started (the data stays)"), ("status", "what is running")):
        sub = clusters.add_parser(verb, help=text)
        sub.add_argument("--dir", default=".seqae-cluster", help="the cluster's folder (default: ./.seqae-cluster)")
        if verb == "up":
            sub.add_argument("--workers", type=int, default=2, help="worker nodes (default: 2)")
            sub.add_argument("--cpus-per-worker", type=int, default=1, help="CPUs each worker offers (default: 1)")
            sub.add_argument("--head-cpus", type=int, default=0, help="CPUs the head offers to trials (default: 0)")
        if verb == "services":
            sub.add_argument("--storage", help="shared storage for checkpoints and artifacts, e.g. s3://bucket/prefix")
        handlers = {"up": cmd_cluster_up, "services": cmd_cluster_up, "down": cmd_cluster_down,
                    "status": cmd_cluster_status}
        sub.set_defaults(handler=handlers[verb])

    bench = commands.add_parser("bench", help="measure speed against baselines; prints tables, writes JSON")
    bench.add_argument("suites", nargs="*", metavar="SUITE",
                       help="which to run (default: all): throughput, overhead, data, search, recipe, defaults, gpu, "
                            "scale")
    bench.add_argument("--out", default="bench-results/bench.json", help="JSON file to write")
    bench.add_argument("--data", default=None, help="dataset path (default: $SEQAE_BENCH_DATA, else the "
                                                    "offline corpus in ../shared, else wikimedia/wikipedia)")
    bench.add_argument("--shapes", default="64:32,512:256", help="throughput: input:latent lengths")
    bench.add_argument("--steps", type=int, default=5, help="throughput: timed steps per measurement")
    bench.add_argument("--seeds", type=int, default=3, help="search: seeds per strategy; recipe: seeds per arm")
    bench.set_defaults(handler=cmd_bench)
    return parser


def _workspace(args: argparse.Namespace) -> Any:
    from sweeps.workspace import Workspace

    return Workspace(args.workspace)


def _sets(args: argparse.Namespace) -> list[str]:
    """``--profile NAME`` is the first override, so every ``--set`` applies on top of the profile."""
    return ([f"profile={args.profile}"] if args.profile else []) + args.set


def cmd_sweep_run(args: argparse.Namespace) -> int:
    from sweeps import service

    workspace = _workspace(args)
    overrides = {"storage": args.storage, "mlflow_tracking_uri": args.mlflow_uri, "optuna_storage": args.optuna_storage}
    name = service.create(workspace, args.file, args.name, _sets(args), overrides, or_resume=args.or_resume)
    return service.drive(workspace, name, check_file=False, verbose=args.verbose)


def cmd_sweep_resume(args: argparse.Namespace) -> int:
    from sweeps import service, submit

    workspace = _workspace(args)
    record = submit.read_record(workspace, args.name)
    if record is not None:
        submit.resubmit(workspace, record)
        print(submit.describe(record))
        return 0
    return service.drive(workspace, args.name, verbose=args.verbose)


def _record(args: argparse.Namespace) -> dict[str, Any]:
    from sweeps import submit

    record = submit.read_record(_workspace(args), args.name)
    if record is None:
        raise ConfigError(f"sweep {args.name!r} was not submitted to a cluster from this workspace")
    return record


def cmd_sweep_submit(args: argparse.Namespace) -> int:
    from sweeps import submit

    record = submit.submit(_workspace(args), args.file, args.name, _sets(args), args.address)
    print(submit.describe(record))
    return 0


def cmd_sweep_logs(args: argparse.Namespace) -> int:
    from sweeps import submit

    print(submit.logs(_record(args)), end="")
    return 0


def cmd_sweep_cancel(args: argparse.Namespace) -> int:
    from sweeps import submit

    record = _record(args)
    stopped = submit.cancel(record)
    print(f"job {record['jobs'][-1]}: {'stop requested' if stopped else 'already finished'}; "
          f"`seqae sweep resume {args.name}` continues it")
    return 0


def cmd_sweep_fork(args: argparse.Namespace) -> int:
    from sweeps import service

    workspace = _workspace(args)
    name = service.fork(workspace, args.origin, args.file, args.name, _sets(args), {})
    return service.drive(workspace, name, check_file=False, verbose=args.verbose)


def cmd_sweep_stop(args: argparse.Namespace) -> int:
    from sweeps import service

    service.control(_workspace(args), args.name, drain=f"stopped by `seqae sweep stop` on {socket.gethostname()}")
    print(f"sweep {args.name}: no new trials start; the running ones finish. `seqae sweep resume {args.name}` "
          "continues it later")
    return 0


def cmd_sweep_set(args: argparse.Namespace) -> int:
    from sweeps import service

    key, _, text = args.change.partition("=")
    if key != "max_concurrent":
        raise ConfigError(f"{args.change!r}: a running sweep can change max_concurrent=N only")
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"max_concurrent={text!r} must be a whole number of at least 1")
    service.control(_workspace(args), args.name, max_concurrent=int(text))
    print(f"sweep {args.name}: max_concurrent={text} from its next trial on (recorded in its study)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from dashboards import report

    workspace = _workspace(args)
    try:
        index = report.build(workspace.read(args.name), workspace.report_dir(args.name))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    print(f"report: {index}  (also logged to the sweep's MLflow run, under report/)")
    return 0


def cmd_encode(args: argparse.Namespace) -> int:
    from seqae_core.checkpoint import marked
    from seqae_core.data import detokenize
    from sweeps.tracking import load_registered

    workspace = _workspace(args)
    uri = os.environ.get("SEQAE_MLFLOW_TRACKING_URI")
    if uri is None:
        if not (workspace.root / "mlflow.db").exists():
            raise ConfigError(f"model {args.model!r}: no sweeps have run in {workspace.root} yet (no mlflow.db); "
                              "pass --workspace, or set SEQAE_MLFLOW_TRACKING_URI")
        uri = f"sqlite:///{workspace.root / 'mlflow.db'}"
    model_uri, model = load_registered(uri, args.model)
    out = model.predict(args.texts)
    print(f"{model_uri}: each text's reconstruction from its latents, wrong tokens [[marked]]")
    for n, row in enumerate(out.itertuples(), 1):
        print(f"\ntext {n}: token accuracy {row.token_accuracy:.4f} ({len(row.tokens)} tokens, "
              f"latents {' x '.join(map(str, row.latents.shape))})")
        print("  original:      " + detokenize(row.tokens))
        print("  reconstructed: " + marked(row.tokens, row.reconstructed_tokens))
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from dashboards import ui
    from sweeps.tracking import check_credentials

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
    from cluster import local

    root = Path(args.dir)
    if args.cluster_command == "services":
        print(f"starting PostgreSQL and MLflow in {root.resolve()} ...", flush=True)
        state = local.up(root, ray=False, storage=args.storage)
    else:
        print(f"starting a Ray head and {args.workers} workers, PostgreSQL and MLflow in {root.resolve()} ...",
              flush=True)
        state = local.up(root, args.workers, args.cpus_per_worker, args.head_cpus)
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
    from cluster import local

    stopped = local.down(Path(args.dir))
    print("stopped: " + (", ".join(stopped) or "nothing was running"))
    return 0


def cmd_cluster_status(args: argparse.Namespace) -> int:
    from cluster import local

    info = local.status(Path(args.dir))
    print(json.dumps(info, indent=1))
    return 0 if all(info["services"].values()) else 1


def cmd_sweep_extend(args: argparse.Namespace) -> int:
    from sweeps import service

    workspace = _workspace(args)
    if args.epochs is not None:
        for note in service.extend_epochs(workspace, args.name, args.epochs, args.trials or "best:1"):
            print(f"seqae: {note}", flush=True)
        return service.drive(workspace, args.name, verbose=args.verbose, extending=True)
    if args.trials is None or not args.trials.isdigit():
        raise ConfigError(f"--trials={args.trials!r}: give how many trials to add (or --epochs N to train finished "
                          "trials on)")
    service.extend(workspace, args.name, int(args.trials))
    return service.drive(workspace, args.name, verbose=args.verbose)


def cmd_sweep_status(args: argparse.Namespace) -> int:
    from sweeps import service, submit

    workspace = _workspace(args)
    record = submit.read_record(workspace, args.name)
    if record is not None and not workspace.exists(args.name):
        # submitted, and its driver keeps its state in the cluster's workspace: read its trials
        # from the backends the submission named, once its driver has created the study
        from sweeps.search import study_exists

        if record.get("backends") and study_exists(record["backends"]["optuna_storage"], args.name):
            info = service.submitted_status(record)
        else:
            info = {"name": args.name, "job": submit.job_info(record)}
            print(json.dumps(info) if args.json else f"sweep {args.name}: job {info['job']['id']} is "
                  f"{info['job']['status']} (its driver has not started its trials yet)")
            return 0
    else:
        info = service.status(workspace, args.name)
        if record is not None:
            info["job"] = submit.job_info(record)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"sweep {info['name']} ({info['outcome']}) in {info['workspace']}")
    if info["profile"]:
        print(f"  profile: {info['profile']}: {info['description']}")
    control = info["control"]
    if control.get("drain"):
        print(f"  {'stopping' if info['outcome'] == 'running' else 'stopped'}: no new trials ({control['drain']})")
    if control.get("max_concurrent"):
        when = next(e["at"] for e in reversed(control["log"]) if "max_concurrent" in e)
        print(f"  max_concurrent: {control['max_concurrent']} (set {when})")
    if info["forked_from"]:
        print(f"  forked from {info['forked_from']}: {info['seeded_trials']} of its trials seeded the study")
    print(f"  trials: {info['trials_total']} planned; " + ", ".join(f"{k} {v}" for k, v in info["trials_by_state"].items()))
    cost = info["cost"]
    budget = f" of a budget of {cost['budget']:g}" if cost["budget"] else ""
    print(f"  cost: {cost['hours']:.4f} {cost['unit']}{budget}")
    best = info["best"]
    for entry in best if isinstance(best, list) else [best] if best else []:
        values = ", ".join(f"{k} {v:.4f}" for k, v in entry["values"].items())
        print(f"  best: trial {entry['trial']}: {values}")
        for key, value in sorted(entry["params"].items()):
            print(f"        {key} = {value}")
    print(f"  MLflow: {info['mlflow_tracking_uri']} experiment {info['mlflow_experiment_id']}, "
          f"sweep run {info['mlflow_parent_run_id']}")
    print(f"  Optuna: {info['optuna_storage']} study {info['optuna_study_name']}")
    if info.get("job"):
        print(f"  job: {info['job']['id']} {info['job']['status']} ({info['job']['dashboard']})")
    return 0


def cmd_sweep_list(args: argparse.Namespace) -> int:
    from sweeps import service

    rows = service.listing(_workspace(args))
    if not rows:
        print("no sweeps in this workspace")
    for row in rows:
        states = ", ".join(f"{k} {v}" for k, v in row["by_state"].items())
        print(f"{row['name']:24s} {row['outcome']:12s} {row['trials']:4d} trials  {states}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from benchmarks.run import SUITES
    from benchmarks.run import main as run_benchmarks

    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        raise ConfigError(f"unknown benchmark suite {unknown[0]!r}; choose from {', '.join(SUITES)}")
    data = args.data or os.environ.get("SEQAE_BENCH_DATA")
    if data is None:
        offline = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikipedia-mini"
        data = str(offline) if offline.exists() else "wikimedia/wikipedia"
    run_benchmarks(args.suites, Path(args.out),
                   {"shapes": args.shapes, "steps": args.steps, "seeds": args.seeds, "data": data})
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from seqae_core import config as config_lib
    from seqae_core import train as train_lib
    from seqae_core.checkpoint import CheckpointStore

    config = config_lib.load(args.config, args.set)
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
                f"--checkpoint-dir {args.checkpoint_dir} already holds a run (epoch {resume['epoch']}); "
                "pass --resume to continue it, or choose another folder"
            )
        if args.resume:
            print(f"seqae: resuming after epoch {resume['epoch']}" if resume else
                  "seqae: no valid checkpoint found; starting from epoch 1", file=sys.stderr)

    def report(metrics: dict[str, Any], checkpoint: dict[str, Any]) -> None:
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


if __name__ == "__main__":
    sys.exit(main())
