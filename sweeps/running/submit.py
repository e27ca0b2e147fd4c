"""Submitting sweeps to a Ray cluster as Ray Jobs, and following them.

``seqae sweep submit`` packages the seqae project it is run from (the files git tracks, the sweep
file and the job's ``--set`` overrides: :mod:`sweeps.running.package`) as the job's working
directory and runs ``seqae sweep run`` as the job's driver on the cluster. The job gets the
``SEQAE_*`` and Hugging Face settings of this shell, never a secret: database passwords stay in a
pgpass file named by ``PGPASSFILE``, the Ray token in the caller's environment, notification URLs
on the cluster (``notify.urls``' ``env:NAME`` and ``file:/PATH``). Ray's token authentication is
honored through the ``Authorization`` header. A shell away from the head (a laptop, through SSH
tunnels) names the cluster's own workspace, stores and pgpass file beside its own as
``SEQAE_CLUSTER_*`` (:data:`CLUSTER_SIDE`); the job gets those.

A record of each submission (job ids, the address) is kept in this shell's workspace, so ``status``,
``logs``, ``cancel`` and ``resume`` work by sweep name.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from pathlib import Path
from typing import Any

from ray.exceptions import AuthenticationError
from ray.job_submission import JobSubmissionClient

from seqae_errors import ConfigError
from sweeps.running import package
from sweeps.running.notify import ENV as NOTIFY_URLS
from sweeps.spec import sweep as spec_lib
from sweeps.stores import ownership
from sweeps.stores.workspace import Job, Submission, Workspace, check_name, redact, resolve_backends

PASSED_PREFIXES = ("SEQAE_", "HF_HUB_", "HF_DATASETS_", "TOKENIZERS_")
PASSED_NAMES = ("PGPASSFILE",)
# the job's own address; each node's own data cache; URLs that hold tokens (the Jobs API shows a
# job's environment to every holder of the Ray token)
NEVER_PASSED = ("SEQAE_RAY_ADDRESS", "SEQAE_CACHE_DIR", NOTIFY_URLS)
# A shell away from the head (a user's env.sh: cluster.accounts) reaches the cluster's servers
# through tunnels and keeps its own workspace; the cluster's own values sit beside its own under
# these names, and the job gets them in their place. Unset, the shell's own are the cluster's.
CLUSTER_SIDE = {
    "SEQAE_WORKSPACE": "SEQAE_CLUSTER_WORKSPACE",
    "SEQAE_MLFLOW_TRACKING_URI": "SEQAE_CLUSTER_MLFLOW_TRACKING_URI",
    "SEQAE_OPTUNA_STORAGE": "SEQAE_CLUSTER_OPTUNA_STORAGE",
    "PGPASSFILE": "SEQAE_CLUSTER_PGPASSFILE",
}
SHELL_ONLY = ("SEQAE_CLUSTER_", "SEQAE_TUNNEL_")  # prefixes of settings for this shell alone

log = logging.getLogger(__name__)


def address(given: str | None) -> str:
    chosen = given or os.environ.get("SEQAE_RAY_ADDRESS")
    if not chosen:
        raise ConfigError("no cluster address: pass --address http://HEAD:8265 or set SEQAE_RAY_ADDRESS")
    if not chosen.startswith(("http://", "https://")):
        raise ConfigError(f"--address {chosen!r} must be the dashboard's URL, e.g. http://127.0.0.1:8265")
    return chosen


def auth_headers() -> dict[str, str]:
    """The Ray token, from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (Ray's order)."""
    token = os.environ.get("RAY_AUTH_TOKEN")
    if not token:
        path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token")).expanduser()
        token = path.read_text().strip() if path.exists() else None
    return {"Authorization": f"Bearer {token}"} if token else {}


def client(url: str) -> Any:
    headers = auth_headers()
    try:
        return JobSubmissionClient(url, headers=headers)
    except AuthenticationError:
        # Ray refuses a missing token itself where RAY_AUTH_MODE=token, else the cluster answers 401
        # (403 for a wrong one); its message runs to a paragraph, what to set here fits in one line.
        token = (
            "RAY_AUTH_TOKEN"
            if os.environ.get("RAY_AUTH_TOKEN")
            else os.environ.get("RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token")
        )
        refusal = (
            f"refuses the token in {token} (403: not this cluster's token)"
            if headers
            else "asks for the cluster's token and none was found (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, "
            "~/.ray/auth_token)"
        )
        raise ConfigError(
            f"the Ray Jobs API at {url} {refusal}: set RAY_AUTH_TOKEN_PATH to the file holding the "
            "cluster's token (the env.sh of `seqae cluster up` exports it) or RAY_AUTH_TOKEN to the "
            "token"
        ) from None
    except Exception as exc:  # noqa: BLE001 - an address that does not answer, a proxy's refusal
        raise ConfigError(f"cannot reach the Ray Jobs API at {url}: {str(exc).splitlines()[0]}") from None


def job_env() -> dict[str, str]:
    """The job's settings: this shell's ``SEQAE_*`` and Hugging Face ones, the cluster's own
    (:data:`CLUSTER_SIDE`) in place of this shell's where it names them."""
    env = {
        k: v
        for k, v in os.environ.items()
        if (k.startswith(PASSED_PREFIXES) or k in PASSED_NAMES)
        and k not in NEVER_PASSED
        and not k.startswith(SHELL_ONLY)
    }
    return env | {k: os.environ[cluster] for k, cluster in CLUSTER_SIDE.items() if os.environ.get(cluster)}


def submit(workspace: Workspace, file: str, name: str | None, sets: list[str], url: str | None) -> Submission:
    """Validate here, then submit ``seqae sweep run`` as a Ray Job; returns the submission record."""
    # A local data folder given on the command line is made absolute: the job runs elsewhere.
    sets = [
        f"data.path={spec_lib.local_path(v)}" if k == "data.path" else f"{k}={v}"
        for k, _, v in (s.partition("=") for s in sets)
    ]
    spec_lib.load(file, sets)  # a bad file fails here, before the cluster sees anything
    name = check_name(name or Path(file).stem)
    url = address(url)
    if workspace.exists(name) or workspace.read_submission(name):
        raise ConfigError(f"a sweep named {name!r} already exists; `seqae sweep resume {name}` continues it")
    env = job_env()
    for key, default in (("SEQAE_MLFLOW_TRACKING_URI", "MLflow"), ("SEQAE_OPTUNA_STORAGE", "Optuna")):
        value = env.get(key, "")
        if not value or value.startswith("sqlite:"):
            raise ConfigError(
                f"{key} is {value or 'unset'}: a submitted sweep runs on several nodes, where SQLite files on the "
                f"driver's disk cannot serve every trial (and lock under concurrent writers). Point {default} at a "
                "server: `seqae cluster up` starts both and prints what to export"
            )
    working_dir = package.project_root(Path.cwd())
    try:
        relative = Path(file).resolve().relative_to(working_dir)
    except ValueError:
        raise ConfigError(
            f"{file} is outside {working_dir}, the directory that is packaged for the cluster; "
            "run from the repository root"
        ) from None
    if os.environ.get(NOTIFY_URLS):
        log.warning(
            "%s is not passed to the job, whose environment the Jobs API shows: name its URLs in the "
            "sweep file's notify.urls as env:NAME or file:/PATH, read on the cluster",
            NOTIFY_URLS,
        )

    cluster_workspace = env.get("SEQAE_WORKSPACE", str(workspace.root))
    # the stores the driver will use, as this shell reaches them (through its tunnels), for `status`
    # here: picked as the driver picks them, from the SEQAE_* settings, a password refused
    backends = resolve_backends(Workspace(cluster_workspace), name, {})
    record = Submission(
        name=name,
        address=url,
        file=str(relative),
        sets=sets,
        workspace=cluster_workspace,
        working_dir=str(working_dir),
        backends=backends,
        owner=ownership.actor(),
    )
    _submit(workspace, record, env)
    return record


def resubmit(
    workspace: Workspace, record: Submission, allow_code_change: bool = False, retry: str | None = None
) -> Submission:
    """Resume a submitted sweep: a new job whose driver restores from the shared state, and goes on
    after its code changed only with ``allow_code_change`` (the user's consent, for this job);
    ``retry`` (``"3,5"`` or ``"failed"``): its driver first gives those failed trials a new attempt
    (`seqae sweep retry` of a sweep on a cluster)."""
    current = _status(record) if record.jobs else None
    if current is not None and not current.is_terminal():
        raise ConfigError(f"sweep {record.name!r} is still running as job {record.jobs[-1]} ({current.value})")
    extra = [*(["--allow-code-change"] if allow_code_change else []), *(["--retry", retry] if retry else [])]
    _submit(workspace, record, job_env(), extra)
    return record


def _submit(workspace: Workspace, record: Submission, env: dict[str, str], extra: list[str] | None = None) -> None:
    """Every job of a sweep runs the same command: it creates the sweep, or resumes it; ``extra``
    arguments are this job's alone (a resume's ``--allow-code-change``, a retry's ``--retry``)."""
    entrypoint = shlex.join(
        [
            "python",
            "-m",
            "seqae",
            "sweep",
            "run",
            record.file,
            "--or-resume",
            "--name",
            record.name,
            "--workspace",
            record.workspace,
            "--sets-file",
            package.SETS_FILE,
            *(extra or []),
        ]
    )
    jobs = client(record.address)
    job_id = f"seqae-{record.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    # The driver runs as the head's user: it acts for the user who submits (its sweep's owner, or an admin)
    user = ownership.actor()
    owned = {"seqae_owner": record.owner} if record.owner else {}
    with package.build(package.project_root(Path(record.working_dir)), record.file, record.sets) as packed:
        jobs.submit_job(
            entrypoint=entrypoint,
            submission_id=job_id,
            metadata={"seqae_sweep": record.name, "seqae_user": user, **owned},
            runtime_env={"working_dir": str(packed.path), "env_vars": {**env, ownership.USER: user}},
        )
    record.jobs.append(job_id)
    record.package_files, record.package_bytes = packed.files, packed.bytes
    workspace.write_submission(record)


def _status(record: Submission) -> Any:
    """The state of the sweep's latest job, or None where the cluster does not know it: a head
    that restarted has forgotten every job (Ray does not persist them without an external GCS)."""
    try:
        return client(record.address).get_job_status(record.jobs[-1])
    except RuntimeError as exc:
        if "status code 404" in str(exc):
            return None
        raise


def job_info(record: Submission) -> Job:
    job_id = record.jobs[-1]
    try:
        current = _status(record)
        state = current.value if current is not None else "UNKNOWN (the cluster no longer knows it: resume resubmits)"
    except ConfigError as exc:
        state = f"unknown ({exc})"
    return Job(job_id, state, redact(record.address), tuple(record.jobs), f"{record.address}/#/jobs/{job_id}")


def logs(record: Submission) -> str:
    return str(client(record.address).get_job_logs(record.jobs[-1]))


def cancel(record: Submission) -> bool:
    return bool(client(record.address).stop_job(record.jobs[-1]))
