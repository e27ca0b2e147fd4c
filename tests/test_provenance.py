"""Which code ran a sweep (sweeps/running/provenance.py): the git commit, uncommitted changes and package
versions on every MLflow run, and a resume refused when the code changed, in a real git clone."""

from __future__ import annotations

import json
import subprocess

import pytest
from mlflow.tracking import MlflowClient

from seqae_errors import ConfigError
from sweeps.running import provenance
from sweeps.running.driver import check_code
from sweeps.spec import sweep as spec_lib
from sweeps.stores.workspace import Backends, SweepState
from tests.sweep_helpers import REPO, STUDIES, mlflow_runs, optuna_trials, run_args, seqae


def git(*args: str, cwd=REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_the_code_is_this_checkout_its_commit_and_the_versions_that_matter():
    code = provenance.current()
    assert code.commit == git("rev-parse", "HEAD")
    assert {"sweeps/running/driver.py", "seqae_core/model.py", "seqae_errors/__init__.py"} <= set(code.files)
    assert not any(p.startswith(("tests/", "dashboards/")) for p in code.files)  # only what drivers and trials run
    assert set(code.versions) == {"torch", "ray", "optuna", "mlflow", "transformers"}
    tags = code.run_tags("sweep.yaml")
    assert tags["mlflow.source.git.commit"] == code.commit and tags["mlflow.source.name"] == "sweep.yaml"
    assert tags["seqae.version.torch"] == code.versions["torch"] and len(tags["seqae.code"]) == 12


def test_a_changed_file_is_refused_by_name_unless_allowed():
    code = provenance.current()
    state = SweepState(
        name="s",
        spec=spec_lib.load(STUDIES / "quickstart.yaml"),
        fingerprint="f",
        file="f.yaml",
        sets=[],
        planned_trials=1,
        backends=Backends("", "", ""),
        study_name="s",
        code={"commit": "0" * 40, "files": {**code.files, "sweeps/running/runner.py": "old", "sweeps/gone.py": "x"}},
    )
    with pytest.raises(
        ConfigError,
        match=r"its code changed since its last session \(2 files: sweeps/gone.py, "
        r"sweeps/running/runner.py; commit 0000000 -> \w{7}\).*`seqae sweep resume s "
        r"--allow-code-change`",
    ):
        check_code(state, allow_code_change=False)
    assert check_code(state, allow_code_change=True)[1].startswith("2 files: sweeps/gone.py, sweeps/running/runner.py")
    assert check_code(SweepState(**{**state.__dict__, "code": None}), False)[1] is None  # an older sweep: recorded now
    assert provenance.changed({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == ["b", "c"]


@pytest.mark.slow
def test_a_resume_after_a_commit_that_changes_the_code_is_refused_then_allowed_and_recorded(tmp_path):
    """In a clone of this repository: a sweep stops at its target after its first trial; a commit
    changes the driver's code; `resume` refuses, naming the file and the commits, and changes
    nothing; `resume --allow-code-change` goes on, and the study's log says so. Every run carries
    the commit its session ran, and an uncommitted change is kept beside the sweep's run."""
    clone = tmp_path / "clone"
    git("clone", "--quiet", str(REPO), str(clone))
    first = git("rev-parse", "HEAD", cwd=clone)
    workspace, name = tmp_path / "ws", "prov"
    ran = seqae(
        *run_args(workspace, name, "trials.total=3", "train.epochs=1", "max_concurrent=1", "objective.target=0.0"),
        cwd=clone,
    )
    assert ran.returncode == 0 and "the target 0.0" in ran.stdout, ran.stdout[-3000:] + ran.stderr[-3000:]
    before = [t.state.name for t in optuna_trials(workspace, name)]

    runner = clone / "sweeps" / "running" / "runner.py"
    runner.write_text(runner.read_text() + "\n# a change between sessions\n")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-am", "a change", cwd=clone)
    second = git("rev-parse", "HEAD", cwd=clone)
    driver_py = clone / "sweeps" / "running" / "driver.py"
    driver_py.write_text(driver_py.read_text() + "\n# uncommitted\n")

    refused = seqae("sweep", "resume", name, "--workspace", str(workspace), cwd=clone)
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert (
        f"its code changed since its last session (2 files: sweeps/running/driver.py, sweeps/running/runner.py; commit "
        f"{first[:7]} -> {second[:7]})"
    ) in refused.stderr and "--allow-code-change" in refused.stderr
    assert [t.state.name for t in optuna_trials(workspace, name)] == before  # nothing ran

    allowed = seqae("sweep", "resume", name, "--workspace", str(workspace), "--allow-code-change", cwd=clone)
    assert allowed.returncode == 0, allowed.stdout[-3000:] + allowed.stderr[-3000:]
    info = json.loads(seqae("sweep", "status", name, "--json", "--workspace", str(workspace), cwd=clone).stdout)
    assert [e["code_change"] for e in info["control"]["log"] if "code_change" in e] == [
        f"2 files: sweeps/running/driver.py, sweeps/running/runner.py; commit {first[:7]} -> {second[:7]}"
    ]

    runs = mlflow_runs(workspace, name)
    parent = next(r for r in runs if r.data.tags.get("seqae.role") == "sweep")
    assert parent.data.tags["mlflow.source.git.commit"] == second and parent.data.tags["seqae.code_dirty"] == "true"
    commits = {r.data.tags["seqae.trial"]: r.data.tags["mlflow.source.git.commit"] for r in runs if r is not parent}
    assert commits["0"] == first and set(commits.values()) <= {first, second} and len(commits) > 1
    diff = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}").download_artifacts(
        parent.info.run_id, f"provenance/code-{parent.data.tags['seqae.code']}.diff", str(tmp_path)
    )
    assert "+# uncommitted" in open(diff).read()
