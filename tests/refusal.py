"""What "refused" means to a user, checked the same way everywhere."""

from __future__ import annotations

from pathlib import Path


def assert_refused(code: int, err: str, says: str, *, created: tuple[Path, ...]) -> None:
    """Exit 2, exactly one `seqae: error:` line, which says ``says``; no traceback; and none of
    ``created`` exists (a refusal comes before anything is made). Each caller names what the command
    would have made: with nothing named, "nothing was created" would be checked by nothing."""
    assert created, "name what a refused command must not create"
    errors = [line for line in err.splitlines() if line.startswith("seqae: error: ")]
    assert code == 2, (code, err)
    assert "Traceback" not in err, err
    assert len(errors) == 1 and says in errors[0], err
    for path in created:
        assert not path.exists(), f"{path} was created by a refused command"
