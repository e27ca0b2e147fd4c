"""The ``seqae`` command line's arguments: one subcommand per verb, each handled by a function
of :mod:`seqae.cli.commands`."""

from __future__ import annotations

import argparse

from seqae.cli.commands import (
    cmd_bench,
    cmd_cluster_add_user,
    cmd_cluster_check_launcher,
    cmd_cluster_down,
    cmd_cluster_gc,
    cmd_cluster_queue,
    cmd_cluster_quota,
    cmd_cluster_status,
    cmd_cluster_up,
    cmd_encode,
    cmd_report,
    cmd_sweep_cancel,
    cmd_sweep_compare,
    cmd_sweep_delete,
    cmd_sweep_export,
    cmd_sweep_extend,
    cmd_sweep_fork,
    cmd_sweep_list,
    cmd_sweep_logs,
    cmd_sweep_plan,
    cmd_sweep_priority,
    cmd_sweep_resume,
    cmd_sweep_retry,
    cmd_sweep_run,
    cmd_sweep_set,
    cmd_sweep_status,
    cmd_sweep_stop,
    cmd_sweep_submit,
    cmd_train,
    cmd_ui,
)


def build_parser() -> argparse.ArgumentParser:
    """Every verb, in the order ``--help`` lists them: a function per group of verbs below."""
    parser = argparse.ArgumentParser(
        prog="seqae", description="A Ray-distributed sweep service for reducing-attention autoencoders."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    _train(commands)

    sweep = commands.add_parser("sweep", help="run and manage sweeps")
    sweeps = sweep.add_subparsers(dest="sweep_command", required=True)

    _sweep_run(sweeps)
    _sweep_submit(sweeps)
    _sweep_steer(sweeps)
    _sweep_continue(sweeps)
    _sweep_read(sweeps)
    _model_verbs(commands)

    cluster = commands.add_parser("cluster", help="a local multi-node Ray cluster with PostgreSQL and MLflow")
    clusters = cluster.add_subparsers(dest="cluster_command", required=True)
    _cluster_lifecycle(clusters)
    _cluster_admin(clusters)
    _bench(commands)
    return parser


def with_workspace(p: argparse.ArgumentParser, verbose: bool = False) -> argparse.ArgumentParser:
    """``p`` with the workspace option every verb on a workspace takes (and ``--verbose`` where it runs a sweep)."""
    p.add_argument(
        "--workspace", help="folder for sweeps, runs and studies (default: $SEQAE_WORKSPACE or ./seqae-runs)"
    )
    if verbose:
        p.add_argument("--verbose", action="store_true", help="also show Ray Tune's own status tables")
    return p


def _train(commands: argparse._SubParsersAction) -> None:
    """`seqae train`: one model on a config."""
    train = commands.add_parser("train", help="train one model on a config")
    train.add_argument("--config", help="YAML file with data/model/train sections")
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set model.latent_len=16 (repeatable)",
    )
    train.add_argument("--json", action="store_true", help="print the final metrics as JSON on the last line")
    train.add_argument("--checkpoint-dir", help="save a checkpoint every epoch (folder or URI)")
    train.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint")
    train.add_argument("--cache-dir", help="tokenized data cache (default: $SEQAE_CACHE_DIR or ~/.cache/seqae/data)")
    train.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: CUDA when present)")
    train.set_defaults(handler=cmd_train)


def _sweep_run(sweeps: argparse._SubParsersAction) -> None:
    """`seqae sweep run`."""
    run = with_workspace(sweeps.add_parser("run", help="start a sweep from a sweep file"), verbose=True)
    run.add_argument("file", help="sweep file, e.g. sweeps/studies/quickstart.yaml")
    run.add_argument("--name", help="the sweep's name (default: the file's name without .yaml)")
    run.add_argument(
        "--or-resume", action="store_true", help="if the sweep exists and the file still describes it, resume it"
    )
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (pins it: it leaves the grid and search) or a sweep setting, "
        "e.g. --set trials.total=4 (repeatable)",
    )
    run.add_argument(
        "--sets-file",
        metavar="PATH",
        help="a JSON list of KEY=VALUE overrides, applied before any --set (a submitted job's: "
        "its command line, which ps and the Jobs API show, holds none)",
    )
    run.add_argument("--profile", help="apply the file's profile of that name first, e.g. --profile laptop")
    run.add_argument(
        "--allow-code-change",
        action="store_true",
        help="with --or-resume: go on although seqae's code changed since the sweep's last session (recorded)",
    )
    run.add_argument(
        "--retry",
        metavar="N,M|failed",
        help="with --or-resume: first give those failed trials (or every failed one) a new attempt, as "
        "`seqae sweep retry` does (the job it submits for a sweep on a cluster runs this)",
    )
    for flag, env, what in (
        (
            "--storage",
            "SEQAE_STORAGE",
            "checkpoints and Tune state: a path every node reaches, or a URI such as s3://bucket/prefix",
        ),
        ("--mlflow-uri", "SEQAE_MLFLOW_TRACKING_URI", "MLflow tracking URI"),
        ("--optuna-storage", "SEQAE_OPTUNA_STORAGE", "Optuna storage URL"),
    ):
        run.add_argument(flag, help=f"{what} (default: ${env}, else inside the workspace)")
    run.set_defaults(handler=cmd_sweep_run)


def _sweep_submit(sweeps: argparse._SubParsersAction) -> None:
    """`seqae sweep plan`, `submit`, `logs` and `cancel`: a sweep's way onto a cluster."""
    planning = with_workspace(
        sweeps.add_parser(
            "plan", help="forecast a sweep before it runs: trials, epochs, resource-hours, wall time, disk, MLflow rows"
        )
    )
    planning.add_argument("file", help="sweep file, e.g. sweeps/studies/quickstart.yaml")
    planning.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for `sweep run`")
    planning.add_argument("--profile", help="as for `sweep run`")
    planning.add_argument(
        "--slots",
        type=int,
        help="trials at once on the cluster that will run it (default: the "
        "share the cluster's queue would give it now, at its priority "
        "and weight, where a sweep has run on its database; else what "
        "this machine's CPUs or GPUs hold); max_concurrent at most",
    )
    planning.add_argument("--json", action="store_true", help="print one JSON object")
    planning.set_defaults(handler=cmd_sweep_plan)

    submit = with_workspace(sweeps.add_parser("submit", help="run a sweep on a Ray cluster, as a Ray Job"))
    submit.add_argument(
        "file",
        help="sweep file inside the current directory, the root of a seqae git checkout "
        "whose tracked files are packaged for the cluster",
    )
    submit.add_argument(
        "--address", help="the cluster's dashboard URL, e.g. http://HEAD:8265 (default: $SEQAE_RAY_ADDRESS)"
    )
    submit.add_argument("--name", help="the sweep's name (default: the file's name without .yaml)")
    submit.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for `sweep run`")
    submit.add_argument("--profile", help="as for `sweep run`")
    submit.add_argument(
        "--priority",
        type=int,
        default=None,
        metavar="N",
        help="its priority for the cluster's trial slots (the sweep file's `priority`, default 0): a "
        "higher one's trials are placed first and take slots from lower ones at their next "
        "validation",
    )
    submit.add_argument(
        "--weight",
        default=None,
        metavar="W",
        help="its weight among sweeps of its priority (the sweep file's `weight`, default 1): their "
        "slots are divided in proportion to their weights",
    )
    submit.set_defaults(handler=cmd_sweep_submit)

    for verb, text in (
        ("logs", "the driver's output of a submitted sweep"),
        ("cancel", "stop a submitted sweep (resume continues it)"),
    ):
        sub = with_workspace(sweeps.add_parser(verb, help=text))
        sub.add_argument("name")
        sub.set_defaults(handler=cmd_sweep_logs if verb == "logs" else cmd_sweep_cancel)


def _sweep_steer(sweeps: argparse._SubParsersAction) -> None:
    """`seqae sweep fork`, `stop`, `retry` and `set`: a sweep's course, changed."""
    forking = with_workspace(
        sweeps.add_parser("fork", help="a new sweep that starts from another's finished trials that fit its space"),
        verbose=True,
    )
    forking.add_argument("origin", help="the sweep whose finished trials seed the new one")
    forking.add_argument("--file", required=True, help="the new sweep's file (e.g. the origin's, narrowed)")
    forking.add_argument("--name", required=True, help="the new sweep's name")
    forking.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for `sweep run`")
    forking.add_argument("--profile", help="as for `sweep run`")
    forking.set_defaults(handler=cmd_sweep_fork)

    stop = with_workspace(
        sweeps.add_parser("stop", help="start no new trials; running ones finish (resume continues the sweep later)")
    )
    stop.add_argument("name")
    stop.add_argument(
        "--now",
        action="store_true",
        help="the running trials stop too, at the end of their epoch; resume continues them from there "
        "(with --trial: that trial stops at once, mid-epoch)",
    )
    stop.add_argument(
        "--trial",
        type=int,
        metavar="N",
        help="stop trial N alone, at its next validation: it keeps its records to there and ends pruned, "
        "as a scheduler's stop ends a trial; its slot goes to the sweep's next trial",
    )
    stop.set_defaults(handler=cmd_sweep_stop)

    retrying = with_workspace(
        sweeps.add_parser(
            "retry",
            help="train failed trials again with their parameters (from their last good checkpoint), then run them",
        ),
        verbose=True,
    )
    retrying.add_argument("name")
    chosen = retrying.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--trials", metavar="N,M", help="the failed trials to retry, e.g. 3,5")
    chosen.add_argument("--failed", action="store_true", help="every failed trial")
    retrying.add_argument(
        "--allow-code-change",
        action="store_true",
        help="go on although seqae's code changed since the sweep's last session (recorded)",
    )
    retrying.set_defaults(handler=cmd_sweep_retry)

    setting = with_workspace(
        sweeps.add_parser(
            "set", help="change a running or stopped sweep: max_concurrent=N, or narrow its space: search.KEY=..."
        )
    )
    setting.add_argument("name")
    setting.add_argument(
        "change",
        metavar="KEY=VALUE",
        help="max_concurrent=N: trials running at once from now on; search.KEY=[a, b] (the choices "
        "to keep), search.KEY=[low, high] (a smaller range) or search.KEY={low: .., high: ..}: "
        "the sampler proposes only inside from its next trial on (wider is a fork)",
    )
    setting.set_defaults(handler=cmd_sweep_set)


def _sweep_continue(sweeps: argparse._SubParsersAction) -> None:
    """`seqae sweep delete`, `priority`, `resume` and `extend`."""
    deleting = with_workspace(
        sweeps.add_parser(
            "delete",
            help="remove a sweep and everything it wrote: its study, "
            "MLflow runs and artifacts, checkpoints, cache entry",
        )
    )
    deleting.add_argument("name")
    deleting.add_argument("--dry-run", action="store_true", help="only list what it would remove, and its size")
    deleting.add_argument(
        "--models", action="store_true", help="also delete the registered model versions of its trials (kept otherwise)"
    )
    deleting.set_defaults(handler=cmd_sweep_delete)

    prioritizing = with_workspace(
        sweeps.add_parser(
            "priority", help="change a sweep's priority for the cluster's trial slots (its owner, or an admin)"
        )
    )
    prioritizing.add_argument("name")
    prioritizing.add_argument("priority", type=int, metavar="N", help="the new priority; higher goes first (default 0)")
    prioritizing.set_defaults(handler=cmd_sweep_priority)

    resume = with_workspace(
        sweeps.add_parser("resume", help="continue an interrupted sweep (resubmits a submitted one)"), verbose=True
    )
    resume.add_argument("name")
    resume.add_argument(
        "--allow-code-change",
        action="store_true",
        help="go on although seqae's code changed since the sweep's last session (recorded)",
    )
    resume.set_defaults(handler=cmd_sweep_resume)

    extend = with_workspace(
        sweeps.add_parser(
            "extend",
            help="add trials to a sweep, using what it learned so far; or, with --epochs, train finished trials on",
        ),
        verbose=True,
    )
    extend.add_argument("name")
    extend.add_argument(
        "--trials",
        help="how many trials to add; with --epochs, which trials train on: best:K "
        "(default best:1) or numbers, e.g. 3,5",
    )
    extend.add_argument(
        "--allow-code-change",
        action="store_true",
        help="go on although seqae's code changed since the sweep's last session (recorded)",
    )
    extend.add_argument(
        "--epochs",
        type=int,
        help="train the chosen finished trials on, from their last checkpoint, to this many epochs",
    )
    extend.set_defaults(handler=cmd_sweep_extend)


def _sweep_read(sweeps: argparse._SubParsersAction) -> None:
    """`seqae sweep status`, `export`, `compare` and `list`: what sweeps hold."""
    status = with_workspace(sweeps.add_parser("status", help="trials by state, the best so far, where things are"))
    status.add_argument("name")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(handler=cmd_sweep_status)

    export = with_workspace(
        sweeps.add_parser(
            "export",
            help="every trial of a sweep as one table (CSV, Parquet or "
            "JSON lines); the columns: sweeps/results/export.py",
        )
    )
    export.add_argument("name")
    export.add_argument(
        "--format", default=None, help="csv, parquet or jsonl (default: what --out's suffix names, else csv)"
    )
    export.add_argument("--out", help="the file to write (default: NAME-trials.EXT here); an existing one is refused")
    export.set_defaults(handler=cmd_sweep_export)

    compare = with_workspace(
        sweeps.add_parser(
            "compare",
            help="sweeps of one objective side by side: bests, test "
            "metrics, costs, trials; and a page in the report's style",
        )
    )
    compare.add_argument("names", nargs="+", metavar="NAME")
    compare.add_argument("--out", help="the page's folder (default: <workspace>/compare/A-vs-B)")
    compare.set_defaults(handler=cmd_sweep_compare)

    listing = with_workspace(sweeps.add_parser("list", help="the sweeps in a workspace"))
    listing.set_defaults(handler=cmd_sweep_list)


def _model_verbs(commands: argparse._SubParsersAction) -> None:
    """`seqae report`, `encode` and `ui`: a sweep's report, its model on texts, the UIs."""
    report = with_workspace(commands.add_parser("report", help="build a sweep's HTML report and log it to MLflow"))
    report.add_argument("name")
    report.set_defaults(handler=cmd_report)

    encode = with_workspace(
        commands.add_parser(
            "encode",
            help="run a registered model on texts: each one's reconstruction, wrong tokens marked, token accuracy",
        )
    )
    encode.add_argument(
        "model",
        help="NAME (the version of its sweep's best trial, alias @best), NAME/VERSION, "
        "NAME@ALIAS or models:/NAME/VERSION, "
        "in the workspace's MLflow (or $SEQAE_MLFLOW_TRACKING_URI)",
    )
    encode.add_argument(
        "texts", nargs="*", metavar="TEXT", help="texts to encode and reconstruct; - reads one from standard input"
    )
    encode.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH",
        help="a UTF-8 file whose whole text is one more text to encode (repeatable)",
    )
    encode.add_argument(
        "--at",
        type=float,
        default=None,
        metavar="SHARE",
        help="with a sweep's Pareto front registered by latent share: its model of the largest "
        "latent share at most SHARE (0.25: a latent of a quarter of the input's floats)",
    )
    encode.set_defaults(handler=cmd_encode)

    ui = with_workspace(commands.add_parser("ui", help="the MLflow UI and optuna-dashboard on a workspace"))
    ui.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to serve on (default: 127.0.0.1); another than loopback only with "
        "--behind-auth-proxy: optuna-dashboard has no login",
    )
    ui.add_argument(
        "--behind-auth-proxy",
        action="store_true",
        help="serve on a --host other than loopback: an authenticating proxy in front of it keeps "
        "out whoever may not change the studies",
    )
    ui.add_argument("--mlflow-port", type=int, default=5000, help="MLflow UI port (default: 5000)")
    ui.add_argument("--optuna-port", type=int, default=8080, help="optuna-dashboard port (default: 8080)")
    ui.set_defaults(handler=cmd_ui)


def _cluster_lifecycle(clusters: argparse._SubParsersAction) -> None:
    """`seqae cluster up`, `services`, `down`, `status`, `add-user` and `gc`."""
    for verb, text in (
        ("up", "start a head and worker raylets on loopback, PostgreSQL and an MLflow server"),
        ("services", "start only PostgreSQL and an MLflow server (beside a launcher's Ray head)"),
        ("down", "stop what `up` started (the data stays)"),
        ("status", "what is running"),
        ("add-user", "an MLflow account for a user, and the folder with what they need to submit"),
        (
            "gc",
            "purge from MLflow's database the rows of the sweeps `seqae sweep delete` deleted through "
            "its server (an admin, where the cluster's files are)",
        ),
    ):
        sub = clusters.add_parser(verb, help=text)
        sub.add_argument("--dir", default=".seqae-cluster", help="the cluster's folder (default: ./.seqae-cluster)")
        if verb == "up":
            sub.add_argument("--workers", type=int, default=2, help="worker nodes (default: 2)")
            sub.add_argument("--cpus-per-worker", type=int, default=1, help="CPUs each worker offers (default: 1)")
            sub.add_argument("--head-cpus", type=int, default=0, help="CPUs the head offers to trials (default: 0)")
            sub.add_argument(
                "--gpus-per-worker",
                type=int,
                default=None,
                help="GPUs each worker offers (`ray start --num-gpus`; default: those Ray detects). "
                "More than the machine has are logical: they rehearse GPU scheduling, and their "
                "trials train on the CPU only if the sweep sets SEQAE_LOGICAL_GPUS=1",
            )
            sub.add_argument(
                "--pass-env",
                action="append",
                default=[],
                metavar="NAME",
                help="also give every node this variable of this shell (repeatable), e.g. the "
                "storage's AWS_ACCESS_KEY_ID or HF_HUB_OFFLINE; a node otherwise gets only "
                "PATH, HOME, the locale and such, and seqae's own settings, since every job "
                "can read its node's environment",
            )
        if verb == "services":
            sub.add_argument("--storage", help="shared storage for checkpoints and artifacts, e.g. s3://bucket/prefix")
        if verb == "add-user":
            sub.add_argument("user", help="the user's name (lower-case letters, digits, '.', '_', '-')")
        handlers = {
            "up": cmd_cluster_up,
            "services": cmd_cluster_up,
            "down": cmd_cluster_down,
            "status": cmd_cluster_status,
            "add-user": cmd_cluster_add_user,
            "gc": cmd_cluster_gc,
        }
        sub.set_defaults(handler=handlers[verb])


def _cluster_admin(clusters: argparse._SubParsersAction) -> None:
    """`seqae cluster queue`, `quota` and `check-launcher`."""
    queue = with_workspace(
        clusters.add_parser(
            "queue",
            help="every sweep on the cluster: its user, priority, "
            "weight, state, slots held / share / quota, trials done, "
            "ETA",
        )
    )
    queue.add_argument("--json", action="store_true", help="print one JSON list")
    queue.set_defaults(handler=cmd_cluster_queue)
    quota = with_workspace(
        clusters.add_parser("quota", help="a user's quota of the cluster's CPUs and GPUs (an admin)")
    )
    quota.add_argument("user")
    quota.add_argument(
        "--cpus", type=float, default=None, help="the most CPUs their sweeps hold at once (default: no limit)"
    )
    quota.add_argument(
        "--gpus", type=float, default=None, help="the most GPUs their sweeps hold at once (default: no limit)"
    )
    quota.set_defaults(handler=cmd_cluster_quota)
    check = clusters.add_parser(
        "check-launcher",
        help="refuse a cluster's config (aws.yaml, the KubeRay manifests) "
        "or IAM policy that still holds a REPLACE_ME_ placeholder",
    )
    check.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="e.g. cluster/aws.yaml cluster/aws-iam/*.json, or cluster/kuberay/*.yaml",
    )
    check.set_defaults(handler=cmd_cluster_check_launcher)


def _bench(commands: argparse._SubParsersAction) -> None:
    """`seqae bench`: what a user measures on their own machine."""
    bench = commands.add_parser("bench", help="measure speed against baselines; prints tables, writes JSON")
    bench.add_argument(
        "suites",
        nargs="*",
        metavar="SUITE",
        help="which to run, one or more: throughput, overhead, data, data-scale, gpu, step, fuse, scale, "
        "processes, control-plane",
    )
    bench.add_argument("--out", default="bench-results/bench.json", help="JSON file to write")
    bench.add_argument(
        "--data",
        default=None,
        help="dataset path (default: $SEQAE_BENCH_DATA, else wikimedia/wikipedia from the Hugging Face Hub)",
    )
    bench.add_argument("--shapes", default="64:32,512:256", help="throughput: input:latent lengths")
    bench.add_argument("--steps", type=int, default=5, help="throughput: timed steps per measurement")
    bench.add_argument(
        "--workspace",
        default=None,
        help="data-scale: where its synthetic pages and their preparation are written (default: a "
        "temporary folder, removed after)",
    )
    bench.add_argument(
        "--pages",
        type=int,
        default=1_900_000,
        help="data-scale: how many synthetic pages to prepare (default: the paper's 1,900,000)",
    )
    bench.add_argument(
        "--interrupt",
        type=float,
        default=None,
        metavar="FRACTION",
        help="data-scale: also kill a second preparation at this fraction of the pages and run it "
        "again, which resumes (for example 0.5)",
    )
    bench.add_argument(
        "--sizes", default="100,1000,10000", help="control-plane: the sweeps' sizes in finished trials, comma-separated"
    )
    bench.add_argument(
        "--optuna",
        default="sqlite,postgresql",
        help="control-plane: the Optuna storages to build them in (sqlite, postgresql)",
    )
    bench.add_argument(
        "--before",
        default=None,
        metavar="DIR",
        help="control-plane: a checkout of seqae from before a change, whose commands are timed on the same sweeps too",
    )
    bench.add_argument(
        "--command",
        default=None,
        metavar="CMD",
        help="processes: the shell command whose CPU-seconds are counted by kind of process (for example .ci/run)",
    )
    bench.set_defaults(handler=cmd_bench)
