"""A sweep's data: checked before the sweep is created, tokenized once by the driver for every
grid cell, and published beside the checkpoints for the nodes of a cluster."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from seqae_core import corpus
from seqae_core import data as data_lib
from sweeps.running.progress import say
from sweeps.spec import sweep as spec_lib
from sweeps.spec.sweep import cell_configs
from sweeps.stores.workspace import Workspace


def check_data(spec: spec_lib.SweepSpec) -> None:
    """Every data source the sweep reads loads (its tokenizer, and a first page with the text
    column), so that an unreachable Hub or a missing folder fails before anything is created."""
    sources = {
        replace(c.data, input_len=1, samples="first", max_pages=1, vocab="tokenizer") for c in cell_configs(spec)
    }
    for source in sources:
        corpus.check_source(source)


def published_data(workspace: Workspace, storage: str) -> str | None:
    """Where the driver publishes the prepared data for the trials' nodes: beside the checkpoints,
    when they go to an object store or to a folder outside the workspace (shared by a cluster's
    nodes). None when they stay in the workspace: the trials then read the driver's cache."""
    if "://" in storage or not Path(storage).resolve().is_relative_to(workspace.root.resolve()):
        return f"{storage.rstrip('/')}/data"
    return None


def prepare_data(
    spec: spec_lib.SweepSpec, cache_dir: str, data_uri: str | None
) -> tuple[int, dict[Any, Path], dict[Any, str]]:
    """Tokenize, once, the data of every grid cell, and publish it to ``data_uri`` if given.
    Returns the most epochs any trial may run, and by data settings (``seqae_core.data.shared_settings``)
    the driver's cache entry (what the trials' MLflow runs record as their dataset) and the URI of
    each published one."""
    configs = cell_configs(spec)
    entries, published = {}, {}
    for data_config in {data_lib.shared_settings(c.data) for c in configs}:
        entry = entries[data_config] = data_lib.prepare(data_config, Path(cache_dir))
        if data_uri:
            moved = data_lib.publish(entry, data_uri)
            published[data_config] = f"{data_uri}/{entry.name}"
            say(
                f"seqae: data entry {entry.name} published to {data_uri}"
                + (f" ({moved / 2**20:.1f} MiB)" if moved else " (already there)")
            )
    return max(c.train.epochs for c in configs), entries, published
