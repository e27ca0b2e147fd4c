"""Which code ran a sweep: the git commit and uncommitted changes of the checkout seqae runs from,
the versions of the packages that decide its numbers, and a digest of every source file its
drivers and trials run (:data:`CODE`), so that a resume can say which files changed since the
sweep's last session. Git is read through GitPython (MLflow's own dependency for its source tags);
an installed seqae that is no git checkout has files and versions but no commit."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import git
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE

from seqae_core import names as N

ROOT = Path(__file__).resolve().parents[2]  # the checkout: sweeps/running/ is two below it
CODE = ("seqae_core", "seqae_errors", "sweeps")  # what a sweep's driver and trials execute
VERSIONS = ("torch", "ray", "optuna", "mlflow", "transformers")


@dataclass(frozen=True)
class Code:
    files: dict[str, str]  # each source file under CODE, relative to the checkout: its sha256
    commit: str | None  # the checkout's HEAD, None outside a git checkout
    diff: str  # uncommitted changes to the tracked files under CODE ("" when none)
    versions: dict[str, str]  # package: version

    @property
    def digest(self) -> str:
        """One short name for the files' contents."""
        return hashlib.sha256("".join(f"{p}:{h}\n" for p, h in sorted(self.files.items())).encode()).hexdigest()[:12]

    def run_tags(self, source: str) -> dict[str, str]:
        """MLflow tags for the runs of a sweep from ``source`` (its file): MLflow's own source
        tags, which its UI shows, and seqae's code digest and package versions."""
        tags = {
            MLFLOW_SOURCE_NAME: source,
            MLFLOW_SOURCE_TYPE: "LOCAL",
            N.CODE: self.digest,
            N.CODE_DIRTY: str(bool(self.diff)).lower(),
            **{f"{N.VERSION}{name}": version for name, version in self.versions.items()},
        }
        if self.commit:
            tags[MLFLOW_GIT_COMMIT] = self.commit
        return tags


def current() -> Code:
    files = {
        str(path.relative_to(ROOT)): hashlib.sha256(path.read_bytes()).hexdigest()
        for package in CODE
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    try:
        repo = git.Repo(ROOT)
        commit: str | None = repo.head.commit.hexsha
        diff = repo.git.diff("HEAD", "--", *CODE)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, git.GitCommandError, ValueError):
        commit, diff = None, ""
    versions = {}
    for name in VERSIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return Code(files, commit, diff, versions)


def changed(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """The files added, removed or changed between two :attr:`Code.files`."""
    return sorted(p for p in before.keys() | now.keys() if before.get(p) != now.get(p))
