"""docs/how-to/paper-scale-on-your-cluster.md's path on machines of one's own, run from the page's
code blocks as written: a head, two GPU workers and a laptop, each a shell with a HOME of its own
on this one machine, the nodes on loopback addresses, the laptop reaching the head through
forwards on other local ports (an SSH tunnel's situation), the storage in the S3-compatible
server. What one machine cannot give is rewritten, each rewrite named in REWRITES with its
reason; a rewrite that no longer finds its text fails the test, so the page cannot drift from
what runs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import boto3
import optuna
import psutil
import pytest

from cluster import local
from cluster.procs import free_port, free_port_block
from tests.conftest import REPO, WIKI_MINI, stop_local_ray
from tests.sweep_helpers import NODE_ENV, forwarded, held, job_driver, mlflow_runs, optuna_trials, wait_for

pytestmark = pytest.mark.slow

PAGE = REPO / "docs" / "how-to" / "paper-scale-on-your-cluster.md"

# Each section's blocks: the machine that runs them, or why none here does.
RUN = {
    "## 1. Start MLflow and PostgreSQL beside the head": ("head",),
    "## 2. Start Ray, or use the cluster you have": ("nodes",),  # its comments say which node runs each line
    "## 3. Point seqae at it": ("head", "laptop"),
    "## 4. Submit the paper's Fig. 3": ("laptop",),
    "## 6. Cancel, resume": ("laptop",),
}
NOT_RUN = {
    "## What each node needs": "an image build: no Docker here (tests/test_kuberay.py checks the Dockerfile's versions)",
    "## 5. Watch it: MLflow and optuna-dashboard": "step 3's tunnels again, and `seqae ui`, a server (tests/test_ui.py)",
    "## On AWS, with the cluster launcher": "an AWS account (tests/test_launcher.py checks the file and the policies)",
    "## 7. Upgrade seqae under a sweep": "tests/test_cluster.py resumes a submitted sweep after a code change",
}

# The sweep: Fig. 3's two cells at 16 tokens on a few offline pages, two epochs of a small model,
# instead of 60 cells of up to 512 tokens over 1.9 M pages for 20 epochs (GPU-days).
TINY = [
    f"data.path={WIKI_MINI}",
    "data.samples=windows",
    "data.max_pages=6",
    "grid.data.input_len=[16]",
    "grid.model.latent_fraction=[1.0,0.5]",
    "model.d_model=16",
    "model.d_attn=16",
    "model.d_ffn=32",
    "train.epochs=2",
    "train.batch_size=64",
]

# What one machine needs that the page's machines do not, each with its reason (the page's own
# words where it gives them).
REWRITES = {
    "the bucket": "the S3-compatible server's bucket for the page's placeholder",
    "node environment": "the page: add the bucket's credentials to each `env -i` line; and this machine's offline "
    "tokenizer (HF_HUB_*), as no node here reaches the Hub",
    "node addresses": "several nodes on one machine: each its own loopback address, ports and Ray folder; the "
    "page's ports (6379, 8265) may be another test's here",
    "logical GPUs": "no GPU here: each worker announces one logical GPU, and the sweep opts in with "
    "SEQAE_LOGICAL_GPUS=1 (the page's rehearsal setting)",
    "copies": "scp from the head: the head's HOME is on this machine",
    "tunnel": "ssh -N -L: forwards from other local ports, as the page's SEQAE_TUNNEL_* paragraph describes, "
    "the head's own ports being taken here",
    "the sweep": "Fig. 3 at tiny sizes (TINY)",
}


@dataclass(frozen=True)
class Block:
    section: str
    text: str


def page_blocks() -> list[Block]:
    """The page's bash blocks with the `##` section each is in."""
    blocks, section = [], ""
    for part in re.split(r"(^## [^\n]*$|^```bash\n.*?^```$)", PAGE.read_text(), flags=re.M | re.S):
        if part.startswith("## "):
            section = part
        elif part.startswith("```bash"):
            blocks.append(Block(section, part.removeprefix("```bash\n").removesuffix("```")))
    return blocks


def rewrite(text: str, old: str, new: str, why: str) -> str:
    assert why in REWRITES
    assert old in text, f"the page no longer has {old!r} ({why}): update the test with the page"
    return text.replace(old, new)


@dataclass
class Machine:
    """A shell on one of the page's machines: its own HOME; each script runs in a session of its own,
    where everything it starts (Ray's daemons) stays, for the clean-up to find."""

    name: str
    home: Path
    env: dict[str, str]
    sessions: list[int]

    def run(self, script: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=cwd or self.home,
            env={**self.env, "HOME": str(self.home)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.sessions.append(process.pid)
        out, err = process.communicate(timeout=600)
        run = subprocess.CompletedProcess(script, process.returncode, out, err)
        print(f"--- {self.name}$ {script.strip()}\n-> exit {run.returncode}\n{out[-2000:]}{err[-2000:]}")
        if check:
            assert run.returncode == 0, f"{self.name}: {script}\n{out[-3000:]}{err[-3000:]}"
        return run


def machine(name: str, root: Path, sessions: list[int], **env: str) -> Machine:
    home = root / name
    home.mkdir()
    base = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "LANG": "C.UTF-8"}
    return Machine(name, home, {**base, **env}, sessions)


def lines_of(block: Block, marker: str) -> str:
    """The lines of a block that follow its comment ``# on {marker}`` up to its next ``# on``."""
    part = re.search(rf"^# on {marker}.*?\n(.*?)(?=^# on |\Z)", block.text, re.M | re.S)
    assert part, f"{block.section}: no lines '# on {marker}'"
    return part.group(1)


# The head's and the workers' addresses: loopback ones apart from the local cluster's (127.0.0.2-4,
# tests/sweep_helpers.local_cluster), so that this test runs beside a local-cluster test, and the
# nodes' ports from a range apart from the one a local cluster takes its first free block from
# (cluster.local.up): two scans from one start at once found the same block. Both lie below the
# kernel's ephemeral ports (32768 on), which free_port hands out.
NODES = ["127.0.0.12", "127.0.0.13", "127.0.0.14"]
NODE_PORTS_FROM = 26000


def test_the_own_machines_how_to_runs_as_written_from_services_to_a_resumed_sweep(tmp_path, s3, monkeypatch):
    stop_local_ray()  # this test process's in-process Ray, if a test left one
    blocks = page_blocks()
    sections = {b.section for b in blocks}
    assert sections == set(RUN) | set(NOT_RUN), sections ^ (set(RUN) | set(NOT_RUN))
    of = {section: [b for b in blocks if b.section == section] for section in sections}
    assert {s: len(of[s]) for s in RUN} == {s: len(m) for s, m in RUN.items()}

    sessions: list[int] = []
    ray_dir = Path(tempfile.mkdtemp(prefix="seqae-ray-"))  # short: Ray's socket paths are limited
    node_env = {k: os.environ[k] for k in NODE_ENV if k in os.environ} | s3
    head = machine("head", tmp_path, sessions, **node_env)
    workers = [machine(f"worker{i}", tmp_path, sessions) for i in (1, 2)]
    laptop = machine("laptop", tmp_path, sessions, SEQAE_LOGICAL_GPUS="1")
    project = laptop.home / "seqae"  # `submit` packages the files git tracks in the project it runs from
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(project)], check=True)
    services = head.home / "seqae-services"
    gcs, dashboard, ports = free_port(), free_port(), free_port_block(local.NODE_PORTS * 3, start=NODE_PORTS_FROM)
    try:
        # 1. services, with the artifacts and checkpoints in the bucket
        (step1,) = of["## 1. Start MLflow and PostgreSQL beside the head"]
        head.run(rewrite(step1.text, "s3://your-bucket/sweeps", "s3://seqae/own-machines", "the bucket"))

        # 2. Ray: the head, then each worker with the head's token
        (step2,) = of["## 2. Start Ray, or use the cluster you have"]
        passed = " ".join(f'{k}="${k}"' for k in sorted(node_env))
        on_head = rewrite(
            lines_of(step2, "the head"), "RAY_AUTH_MODE=token", f"RAY_AUTH_MODE=token {passed}", "node environment"
        )
        on_head = rewrite(on_head, "--port=6379 ", f"--port={gcs} ", "node addresses")
        on_head = rewrite(
            on_head,
            "--num-cpus=0",
            "--num-cpus=0 "
            + shlex.join(
                [
                    f"--dashboard-port={dashboard}",
                    f"--temp-dir={ray_dir}",
                    *local.HEAD_ARGS,
                    f"--ray-client-server-port={ports + local.NODE_PORTS - 1}",
                    *local.node_args(NODES[0], ports, None),
                ]
            ),
            "node addresses",
        )
        head.run(on_head)
        for i, worker in enumerate(workers, 1):
            ip = NODES[i]
            script = rewrite(lines_of(step2, "each GPU worker"), "scp -p HEAD:", f"cp -p {head.home}/", "copies")
            script = rewrite(script, "RAY_AUTH_MODE=token", f"RAY_AUTH_MODE=token {passed}", "node environment")
            script = rewrite(
                script,
                "--address=HEAD:6379",
                f"--address={NODES[0]}:{gcs} "
                + shlex.join(
                    [f"--temp-dir={ray_dir}", *local.node_args(ip, ports + local.NODE_PORTS * i, None, gpus=1)]
                ),
                "node addresses",
            )
            worker.env |= node_env  # `env -i` above names them from the worker's shell
            worker.run(script)
        token = (head.home / ".ray" / "auth_token").read_text().strip()
        assert oct((head.home / ".ray" / "auth_token").stat().st_mode & 0o777) == "0o600"
        assert all((w.home / ".ray" / "auth_token").read_text().strip() == token for w in workers)
        from ray.job_submission import JobSubmissionClient

        jobs = JobSubmissionClient(f"http://127.0.0.1:{dashboard}", headers={"Authorization": f"Bearer {token}"})
        token_file = str(head.home / ".ray" / "auth_token")
        wait_for(lambda: len(local.alive_nodes(dashboard, token_file)) == 3, 60, "the head and two workers")

        # 3. alice's account on the head; her folder copied to the laptop, the tunnels opened
        add_user, on_laptop = of["## 3. Point seqae at it"]
        printed = head.run(add_user.text).stdout
        state = local.read_state(services)
        head_ports = [state.mlflow.port, state.postgres.port]
        assert "ssh -N " + " ".join(f"-L {p}:127.0.0.1:{p}" for p in head_ports) + " YOU@HEAD" in printed, printed
        script = rewrite(on_laptop.text, "scp -r you@HEAD:seqae-services", f"cp -r {services}", "copies")
        ssh = re.search(r"^ssh -N .* you@HEAD &.*\n", script, re.M)
        assert ssh and "the ports add-user printed" in ssh.group(0), script
        script = rewrite(script, ssh.group(0), "", "tunnel")
        with contextlib.ExitStack() as tunnels:
            local_port = {p: tunnels.enter_context(forwarded(p)) for p in [dashboard, *head_ports]}
            mlflow_port, postgres_port = head_ports
            laptop.env |= {
                "SEQAE_TUNNEL_MLFLOW_PORT": str(local_port[mlflow_port]),
                "SEQAE_TUNNEL_POSTGRES_PORT": str(local_port[postgres_port]),
            }
            script = rewrite(script, "http://127.0.0.1:8265", f"http://127.0.0.1:{local_port[dashboard]}", "tunnel")
            sourced = laptop.run(script + "\nenv -0\n").stdout
            laptop.env = {
                k: v
                for k, v in (line.split("=", 1) for line in sourced.split("\0") if "=" in line)
                if k not in {"HOME", "PWD", "SHLVL", "_", "OLDPWD"}
            }
            # the head's paths are named for the jobs, never read here
            assert sorted(k for k, v in laptop.env.items() if str(head.home) in v) == [
                "SEQAE_CLUSTER_PGPASSFILE",
                "SEQAE_CLUSTER_WORKSPACE",
            ], laptop.env
            info = _laptop_sweep(of, laptop, project, jobs, monkeypatch)
        for key, value in local.mlflow_credentials(state).items():  # the admin reads every user's runs
            monkeypatch.setenv(key, value)
        runs = mlflow_runs(None, "paper-fig3", tracking_uri=f"http://127.0.0.1:{mlflow_port}")
        from mlflow.server import get_app_client

        manage = (
            get_app_client("basic-auth", tracking_uri=f"http://127.0.0.1:{mlflow_port}")
            .get_user_permission("alice", "experiment", runs[0].info.experiment_id)
            .permission
        )
        bucket = boto3.client(
            "s3",
            endpoint_url=s3["AWS_ENDPOINT_URL"],
            region_name=s3["AWS_DEFAULT_REGION"],
            aws_access_key_id=s3["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=s3["AWS_SECRET_ACCESS_KEY"],
        )
        keys = [
            o["Key"]
            for page in bucket.get_paginator("list_objects_v2").paginate(Bucket="seqae", Prefix="own-machines/")
            for o in page.get("Contents", [])
        ]
    finally:
        down = head.run("seqae cluster down --dir ~/seqae-services", check=False)  # the page's tear-down
        for process in _started(sessions, ray_dir):  # the page's `ray stop` on each node: this cluster's Ray only
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        assert down.returncode == 0, down.stderr
    wait_for(lambda: not _started(sessions, ray_dir), 30, "the cluster's processes to exit")
    assert info["job"]["status"] == "SUCCEEDED" and info["outcome"] == "complete", info
    assert info["trials_by_state"] == {"COMPLETE": 2} and info["owner"] == "alice", info
    assert any("not readable from this machine" in note for note in info["notes"]), info["notes"]  # no bucket here
    assert {r.data.tags["seqae.owner"] for r in runs} == {"alice"}
    assert len([r for r in runs if "seqae.trial" in r.data.tags]) == 2
    assert manage == "MANAGE"  # alice created the experiment: the driver signed in as her
    # the data published once for the workers, the checkpoints and MLflow's artifacts: all in the bucket
    assert any("/data/" in k for k in keys) and any("mlartifacts/" in k for k in keys), keys[:40]


def _laptop_sweep(of: dict[str, list[Block]], laptop: Machine, project: Path, jobs, monkeypatch) -> dict:
    """Steps 4 and 6 from the laptop's clone of the project: submit, watch, cancel while the
    sweep's first trial trains, resume to the sweep's end. Returns its final `status --json`."""
    (step4,) = of["## 4. Submit the paper's Fig. 3"]
    (step6,) = of["## 6. Cancel, resume"]
    submit, status, logs = step4.text.strip().splitlines()
    laptop.run(
        rewrite(
            submit,
            "--name paper-fig3",
            "--name paper-fig3 " + shlex.join([a for s in TINY for a in ("--set", s)]),
            "the sweep",
        ),
        cwd=project,
    )
    assert "paper-fig3" in laptop.run(status, cwd=project).stdout
    laptop.run(logs, cwd=project)

    from sweeps.stores.workspace import Workspace

    workspace = Workspace(project / "seqae-runs")  # the laptop's own (the default, ./seqae-runs)
    record = workspace.read_submission("paper-fig3")
    assert record is not None and record.workspace == laptop.env["SEQAE_CLUSTER_WORKSPACE"]
    job_env = jobs.get_job_info(record.jobs[-1]).runtime_env["env_vars"]
    assert job_env["SEQAE_USER"] == "alice" and job_env["SEQAE_LOGICAL_GPUS"] == "1"
    for key in ("WORKSPACE", "MLFLOW_TRACKING_URI", "OPTUNA_STORAGE"):
        assert job_env[f"SEQAE_{key}"] == laptop.env[f"SEQAE_CLUSTER_{key}"], key  # the cluster's, not the laptop's
    monkeypatch.setenv("PGPASSFILE", laptop.env["SEQAE_CLUSTER_PGPASSFILE"])
    storage = laptop.env["SEQAE_CLUSTER_OPTUNA_STORAGE"]

    def started() -> list:
        return [t for t in optuna_trials(Path(), "paper-fig3", storage) if t.state.name != "WAITING"]

    def unfinished() -> bool:
        return "paper-fig3" in optuna.get_all_study_names(storage) and any(
            t.state.name != "COMPLETE" for t in started()
        )

    # the driver held (SIGSTOP) from its first trial's start until the cancel: the sweep cannot end first
    driver = job_driver("paper-fig3")
    wait_for(lambda: held(driver, unfinished), 600, "a trial of paper-fig3 started, held", every=0.5)
    cancel, resume = step6.text.strip().splitlines()
    try:
        laptop.run(cancel, cwd=project)
    finally:
        driver.send_signal(signal.SIGCONT)
    wait_for(lambda: jobs.get_job_status(record.jobs[-1]).is_terminal(), 300, "the cancelled job", every=1)
    assert jobs.get_job_status(record.jobs[-1]).value == "STOPPED"
    laptop.run(resume, cwd=project)
    resumed = workspace.read_submission("paper-fig3")
    assert resumed is not None and len(resumed.jobs) == 2
    wait_for(lambda: jobs.get_job_status(resumed.jobs[-1]).is_terminal(), 600, "the resumed job", every=1)
    info = json.loads(laptop.run("seqae sweep status paper-fig3 --json", cwd=project).stdout)
    # stop and set reach the study through the PostgreSQL tunnel
    laptop.run("seqae sweep set paper-fig3 max_concurrent=3", cwd=project)
    laptop.run("seqae sweep stop paper-fig3", cwd=project)
    control = json.loads(laptop.run("seqae sweep status paper-fig3 --json", cwd=project).stdout)["control"]
    assert control["max_concurrent"] == 3 and "stopped by alice" in control["drain"], control
    assert sorted(p.name for p in (project / "seqae-runs" / "sweeps").iterdir()) == ["paper-fig3"]
    assert (
        Workspace(laptop.env["SEQAE_CLUSTER_WORKSPACE"]).read_submission("paper-fig3") is None
    )  # nothing written there
    return info


def _started(sessions: list[int], ray_dir: Path) -> list[psutil.Process]:
    """What the machines' scripts started and left running: Ray's daemons, whose sessions are the
    scripts', and whatever names the cluster's Ray folder."""
    return local.ray_processes(str(ray_dir), sessions)
