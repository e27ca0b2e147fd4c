"""The commit's seed, and the variants of a long test that CI runs one of per commit.

Some slow tests exist in variants that exercise one mechanism each way (ASHA, Hyperband, ASHA
on two objectives: :func:`rotated`), and some slow tests meet one kind of fault each on the same
machinery (the local cluster's: :func:`in_turn`; the chaos soak still kills a worker and
restarts PostgreSQL on that cluster at every commit). With ``SEQAE_ROTATION=commit`` (what
``tests/run``, and so CI, sets) a commit runs one of each group, picked by the seed of its product
code, and the others are skipped with that reason, so that ``-ra`` names what this commit did not
run; a change to the product code picks another. Unset, or ``SEQAE_ROTATION=all``, every variant
runs. The chaos soak draws its fault schedule from the same seed (tests/test_chaos.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

CODE = ("seqae_errors", "seqae_core", "sweeps", "cluster", "dashboards", "seqae")


def commit_seed() -> int:
    """A seed from the product code of the commit checked out (the trees of its packages): each
    landing that changes the code gets another; one that changes only the tests or the
    documentation keeps its seed."""
    trees = subprocess.run(
        ["git", "ls-tree", "HEAD", "--", *CODE],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return int(hashlib.sha256(trees.stdout.encode()).hexdigest()[:8], 16) % 10_000


def _turn(names: list[str], salt: int) -> tuple[int, str] | None:
    """The commit's seed and the name it picks from ``names`` (``salt`` gives each group its own
    turn), or None where every one runs."""
    if os.environ.get("SEQAE_ROTATION", "all") != "commit":
        return None
    seed = commit_seed()
    return seed, names[(seed + salt) % len(names)]


def _reason(seed: int, chosen: str, what: str) -> str:
    return (
        f"rotated out: commit seed {seed} runs {what} {chosen} (SEQAE_ROTATION=all runs every one; tests/rotation.py)"
    )


def rotated(variants: list[tuple[str, tuple]], salt: int = 0) -> list:
    """``pytest.param``s of ``variants`` (``(id, values)`` pairs): each of them, or with
    ``SEQAE_ROTATION=commit`` the one the commit's seed picks, the others marked to skip with the
    seed that chose."""
    turn = _turn([name for name, _ in variants], salt)
    if turn is None:
        return [pytest.param(*values, id=name) for name, values in variants]
    seed, chosen = turn
    skip = pytest.mark.skip(reason=_reason(seed, chosen, "the variant"))
    return [pytest.param(*values, id=name, marks=() if name == chosen else skip) for name, values in variants]


def in_turn(name: str, group: list[str], salt: int = 0, what: str = "the fault test") -> pytest.MarkDecorator:
    """A mark for one of ``group``, tests that each meet one kind of fault on the same machinery
    (the local cluster's): with ``SEQAE_ROTATION=commit`` only the one the commit's seed picks
    runs, the others skip saying which ran."""
    turn = _turn(group, salt)
    chosen = name if turn is None else turn[1]
    return pytest.mark.skipif(name != chosen, reason=_reason(*turn, what) if turn else "")
