"""What a submitted sweep's Ray Job gets as its working directory: the files git tracks in the seqae
project it is submitted from (its working tree's contents, uncommitted changes included), the
sweep file even where git does not track it, and the job's own settings file; nothing else. An
``.env``, a key file, a cluster's state folder or the rest of a home folder beside the project is
never packaged: a package stays in Ray's object store, readable by every job of the cluster.

The package is a zip made in a private temporary folder; Ray's Jobs API uploads a local zip given
as ``working_dir`` as it is, and unpacks it on each node that runs the job's processes."""

from __future__ import annotations

import json
import stat
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import git

from seqae_errors import ConfigError
from sweeps.running import ray_private as RP

# The job's --set overrides, in the package rather than on its command line, which `ps` and the
# Jobs API's job list show to everyone.
SETS_FILE = ".seqae-job-sets.json"
# What marks the root of a seqae project: the files the job's entrypoint and install need.
MARKERS = ("pyproject.toml", "seqae/__main__.py")
# Every entry's time, so that the same files make the same zip and Ray uploads it once.
EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Package:
    """A job's working directory, zipped."""

    path: Path  # the zip, in a temporary folder only its owner can read; gone once the upload is done
    files: int
    bytes: int


def project_root(directory: Path) -> Path:
    """``directory`` if it is the root of a git work tree holding seqae's project; else ConfigError."""
    root = directory.resolve()
    try:
        top = git.Repo(root).working_tree_dir
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        top = None
    if top is None or Path(top).resolve() != root or not all((root / m).is_file() for m in MARKERS):
        raise ConfigError(
            f"{root} is not the root of a seqae git checkout (with {' and '.join(MARKERS)}), which "
            "is all that `submit` packages for the cluster: run it from the repository's root"
        )
    return root


def tracked(root: Path) -> list[str]:
    """The files git tracks under ``root`` that exist as plain files (a deleted or linked one is left out)."""
    names = git.Repo(root).git.ls_files("-z").split("\0")
    return [n for n in names if n and (root / n).is_file() and not (root / n).is_symlink()]


@contextmanager
def build(root: Path, sweep_file: str, sets: list[str]) -> Iterator[Package]:
    """Zip ``root``'s tracked files, ``sweep_file`` (relative to ``root``) and the job's ``sets``
    (:data:`SETS_FILE`); the zip is removed on leaving the block."""
    names = sorted(set(tracked(root)) | {sweep_file})
    with tempfile.TemporaryDirectory(prefix="seqae-package-") as folder:  # mode 700
        path = Path(folder) / "job.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as package:
            for name in names:
                entry = zipfile.ZipInfo(name, EPOCH)
                # a regular file with its permission bits: an executable stays executable where Ray unpacks it
                entry.external_attr = (stat.S_IFREG | (root / name).stat().st_mode & 0o777) << 16
                package.writestr(entry, (root / name).read_bytes(), zipfile.ZIP_DEFLATED)
            package.writestr(zipfile.ZipInfo(SETS_FILE, EPOCH), json.dumps(sets))
        size = path.stat().st_size
        if size >= (limit := RP.job_upload_limit()):
            raise ConfigError(
                f"the files git tracks in {root} zip to {size / 2**20:.0f} MiB, more than the "
                f"{limit / 2**20:.0f} MiB Ray's Jobs API takes: keep data and outputs out of git"
            )
        yield Package(path, len(names) + 1, size)
