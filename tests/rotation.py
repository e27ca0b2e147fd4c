"""The commit's seed, and the variants of a long test that CI runs one of per commit.

Some slow tests exist in variants that exercise one mechanism each way (ASHA, Hyperband, ASHA
on two objectives). With ``SEQAE_ROTATION=commit`` (what ``tests/run``, and so CI, sets) a commit
runs one variant of each, picked by the seed of its product code, and the others are skipped
with that reason, so that ``-ra`` names what this commit did not run; a change to the product
code picks another. Unset, or ``SEQAE_ROTATION=all``, every variant runs. The chaos soak draws
its fault schedule from the same seed (tests/test_chaos.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

CODE = ("seqae_errors", "seqae_core", "sweeps", "cluster", "dashboards", "seqae_cli")


def commit_seed() -> int:
    """A seed from the product code of the commit checked out (the trees of its packages): each
    landing that changes the code gets another; one that changes only the tests or the
    documentation keeps its seed."""
    trees = subprocess.run(["git", "ls-tree", "HEAD", "--", *CODE], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[1])
    return int(hashlib.sha256(trees.stdout.encode()).hexdigest()[:8], 16) % 10_000


def rotated(variants: list[tuple[str, tuple]], salt: int = 0) -> list:
    """``pytest.param``s of ``variants`` (``(id, values)`` pairs): each of them, or with
    ``SEQAE_ROTATION=commit`` the one the commit's seed picks (``salt`` gives each test its own
    turn), the others marked to skip with the seed that chose."""
    if os.environ.get("SEQAE_ROTATION", "all") != "commit":
        return [pytest.param(*values, id=name) for name, values in variants]
    seed = commit_seed()
    chosen = variants[(seed + salt) % len(variants)][0]
    reason = (f"rotated out: commit seed {seed} runs the variant {chosen} of this test "
              f"(SEQAE_ROTATION=all runs every variant; tests/rotation.py)")
    return [pytest.param(*values, id=name, marks=() if name == chosen else pytest.mark.skip(reason=reason))
            for name, values in variants]
