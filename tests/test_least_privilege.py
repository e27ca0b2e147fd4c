"""What a user of a shared cluster hands to it, checked without a cluster: a submitted job's
package holds the project's tracked files and nothing planted beside them, a folder that is no
seqae project is refused, a job's --set overrides arrive in a file, and `seqae ui` serves on
loopback only unless an authenticating proxy fronts it. (On a real cluster: tests/test_cluster.py.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
import zipfile

import pytest

from dashboards.ui import check_host, loopback
from seqae_errors import ConfigError
from sweeps.running import package
from sweeps.running import ray_private as RP
from sweeps.spec import sweep as spec_lib
from tests.conftest import REPO
from tests.sweep_helpers import STUDIES, seqae

PLANTED = f"planted-{uuid.uuid4().hex}"  # made here: the tracked files (this one too) never hold it
NOT_THE_CLUSTER = {
    "SEQAE_RAY_ADDRESS": "http://127.0.0.1:9",
    "SEQAE_MLFLOW_TRACKING_URI": "http://127.0.0.1:9",
    "SEQAE_OPTUNA_STORAGE": "postgresql+psycopg://seqae@127.0.0.1:9/optuna",
}


@pytest.fixture
def clone(tmp_path):
    """A clone of the repository with an `.env`, a key file and a cluster's secrets folder planted
    in it, untracked, and an untracked sweep file of the user's own."""
    root = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(root)], check=True)
    (root / ".env").write_text(f"API_KEY={PLANTED}\n")
    (root / "id_rsa.pem").write_text(f"-----BEGIN KEY-----\n{PLANTED}\n")
    (root / ".seqae-cluster" / "secrets").mkdir(parents=True)
    (root / ".seqae-cluster" / "secrets" / "pgpass").write_text(f"127.0.0.1:5432:*:seqae:{PLANTED}\n")
    shutil.copy(STUDIES / "quickstart.yaml", root / "mine.yaml")
    return root


def test_a_package_holds_the_tracked_files_and_the_sweep_file_and_nothing_planted_beside_them(clone):
    tracked = set(
        subprocess.run(["git", "ls-files"], cwd=clone, capture_output=True, text=True, check=True).stdout.split()
    )
    with package.build(package.project_root(clone), "mine.yaml", ["description=x", "trials.total=2"]) as packed:
        assert oct(packed.path.parent.stat().st_mode)[-3:] == "700"  # a private temporary folder
        with zipfile.ZipFile(packed.path) as zipped:
            names = set(zipped.namelist())
            contents = [zipped.read(n) for n in names]
            sets = json.loads(zipped.read(package.SETS_FILE))
        assert packed.bytes == packed.path.stat().st_size and packed.files == len(names)
        built = packed.path
    assert not built.exists()  # gone once the block is left
    assert "seqae/__main__.py" in tracked and names == tracked | {"mine.yaml", package.SETS_FILE}
    assert not [n for n in names if n in (".env", "id_rsa.pem") or n.startswith(".seqae-cluster")]
    assert not [c for c in contents if PLANTED.encode() in c]
    assert sets == ["description=x", "trials.total=2"]
    assert packed.bytes < RP.job_upload_limit() <= 512 * 2**20  # Ray's limits, read on the installed Ray


@pytest.mark.parametrize("where", ["home", "subfolder", "no-git"])
def test_submit_refuses_a_folder_that_is_not_a_seqae_projects_root_before_anything_is_made(tmp_path, clone, where):
    folder = {"home": tmp_path / "home", "subfolder": clone / "sweeps", "no-git": tmp_path / "copy"}[where]
    if where == "home":  # a home folder: the user's secrets beside a sweep file
        folder.mkdir()
        (folder / ".env").write_text(f"API_KEY={PLANTED}\n")
    elif where == "no-git":  # the project's files, but no checkout to say which are its own
        shutil.copytree(clone, folder, ignore=shutil.ignore_patterns(".git"))
    shutil.copy(STUDIES / "quickstart.yaml", folder / "mine.yaml")
    run = seqae("sweep", "submit", "mine.yaml", "--workspace", str(tmp_path / "ws"), cwd=folder, env=NOT_THE_CLUSTER)
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"{folder.resolve()} is not the root of a seqae git checkout" in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "ws").exists()


def test_sweep_run_reads_its_overrides_from_a_sets_file(tmp_path):
    from seqae.cli.commands import _sets_file

    path = tmp_path / "sets.json"
    path.write_text(json.dumps(["trials.total=3", "description=from a file"]))
    spec = spec_lib.load(STUDIES / "quickstart.yaml", _sets_file(str(path)))
    assert spec.trials.total == 3 and spec.description == "from a file"
    path.write_text(json.dumps({"trials.total": 3}))
    with pytest.raises(ConfigError, match="--sets-file .* must hold a JSON list of KEY=VALUE strings"):
        _sets_file(str(path))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_ui_refuses_a_host_other_than_loopback_before_anything_starts(tmp_path, host):
    run = seqae("ui", "--host", host, "--workspace", str(tmp_path / "ws"), "--optuna-port", "9")
    assert run.returncode == 2, run.stdout + run.stderr
    line = run.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith(
        f"seqae: error: --host {host}: optuna-dashboard has no login"
    ), line
    assert "SSH tunnel" in line and "--behind-auth-proxy" in line and not (tmp_path / "ws").exists()


def test_ui_serves_beyond_loopback_only_behind_an_authenticating_proxy():
    assert loopback("127.0.0.1") and loopback("::1") and loopback("localhost") and not loopback("0.0.0.0")
    check_host("127.0.0.1", behind_auth_proxy=False)
    check_host("0.0.0.0", behind_auth_proxy=True)
    with pytest.raises(ConfigError, match="--host 0.0.0.0"):
        check_host("0.0.0.0", behind_auth_proxy=False)
