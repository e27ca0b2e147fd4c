"""The package as a user installs it: a wheel built with `python -m build` from the files git
tracks, installed (not editable) in a fresh virtual environment, runs the README's quickstart from
another folder, offline. A file the package reads at run time that the wheel leaves out (a sweep
file, a template of the report) fails it; pyproject.toml's package data is where it goes in."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from sweeps.stores.workspace import Workspace
from tests.conftest import REPO, SHARED, stop_local_ray
from tests.sweep_helpers import TINY, sets


def tracked_copy(folder: Path) -> Path:
    """The files git tracks, as a clean clone holds them: nothing else of the working tree (build/,
    egg-info, caches, a run's outputs) reaches the wheel, and the test writes nothing into it."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in filter(None, names.split("\0")):
        if (REPO / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, folder / name)
    return folder


def fresh_environment(folder: Path, wheel: Path) -> tuple[Path, Path]:
    """A virtual environment holding ``wheel``, installed without its dependencies; its Python and
    its site-packages. The dependencies (PyTorch, Ray, MLflow: minutes and the network to install
    again) are this environment's, through a path file read after the fresh site-packages, so the
    wheel's packages are found first. A path line adds the folder only: the `.pth` files in it, this
    environment's editable install among them, are not run, so no import reaches the source tree.
    The path file is written after the install, so that pip sees no seqae installed beside it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    here = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "zz-dependencies-of-the-test-environment.pth").write_text("".join(f"{path}\n" for path in here))
    return python, site


@pytest.mark.slow
def test_the_wheel_installed_in_a_fresh_environment_runs_the_quickstart_from_another_folder(tmp_path):
    source = tracked_copy(tmp_path / "source")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("seqae-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        inside = archive.namelist()
    tops = {name.split("/")[0] for name in inside if "/" in name}
    packages = sorted(top for top in tops if not top.endswith((".dist-info", ".data")))
    python, site = fresh_environment(tmp_path / "env", wheel)

    elsewhere = tmp_path / "elsewhere"  # neither the source tree nor the environment
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SEQAE_WORKSPACE", "RAY_ADDRESS")}
    env.update(
        PATH=f"{python.parent}{os.pathsep}{env['PATH']}",
        VIRTUAL_ENV=str(python.parent.parent),
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=env.get("HF_HUB_CACHE", str(SHARED / "hf" / "hub")),
    )
    imports = "import importlib, sys\nfor name in sys.argv[1:]: print(importlib.import_module(name).__file__)"
    where = subprocess.run([python, "-c", imports, *packages], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr[-3000:]
    files = [Path(line) for line in where.stdout.split()]
    assert len(files) == len(packages) >= 5 and all(f.is_relative_to(site) for f in files), where.stdout

    # The README's main command, on the quickstart the wheel installed, at the tests' tiny sizes
    studies = [site / name for name in inside if name.endswith("studies/quickstart.yaml")]
    assert len(studies) == 1, "the wheel holds no studies/quickstart.yaml: pyproject.toml's package data"
    stop_local_ray()  # the command starts a local Ray of its own
    tiny = sets(*TINY, "trials.total=1", "train.epochs=1")
    run = subprocess.run(
        [python.parent / "seqae", "sweep", "run", str(studies[0]), *tiny],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"^seqae: best: trial 0  val_token_accuracy 0\.\d{4} ", run.stdout, re.M), run.stdout[-3000:]
    assert "Traceback" not in run.stdout + run.stderr, run.stderr[-3000:]
    # the report, written from the templates the wheel holds, in ./seqae-runs as the README says
    report = Workspace(elsewhere / "seqae-runs").report_dir("quickstart") / "index.html"
    assert report.is_file() and "</html>" in report.read_text(), sorted((elsewhere / "seqae-runs").rglob("*"))
