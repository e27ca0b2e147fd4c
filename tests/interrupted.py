"""A training run cut short as a killed one is: what every resume test starts from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from seqae_core.checkpoint import Checkpoint, CheckpointStore
from seqae_core.config import Config
from seqae_core.epoch import EpochRecord
from seqae_core.train import train


class Stop(Exception):
    """Raised from the report: the run ends there, after its checkpoint was saved."""


def train_until(
    config: Config, folder: Path, last: Callable[[EpochRecord], bool], cache_dir: Any
) -> tuple[Checkpoint, CheckpointStore]:
    """Train ``config``, saving each report's checkpoint in a store in ``folder``, and stop right
    after the first report ``last`` holds for; return the checkpoint the store resumes from, and
    the store (a store that skipped a damaged record fails here)."""
    store = CheckpointStore(str(folder))

    def report(record: EpochRecord, checkpoint: Checkpoint) -> None:
        store.save(record, checkpoint)
        if last(record):
            raise Stop

    with pytest.raises(Stop):
        train(config, report, cache_dir=cache_dir)
    state, skipped = store.resume()
    assert state is not None and skipped == [], skipped
    return state, store
