"""Corpora in the layout of ``wikimedia/wikipedia`` (so that ``data.path`` loads them like the
offline corpus) built from text already on the machine, for measuring data preparation."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

NAME = "20231101.en"  # the dataset config the studies load


def repeated(source: Path, folder: Path, copies: int) -> Path:
    """``source`` (a folder in the layout of ``wikimedia/wikipedia``) with its pages repeated
    ``copies`` times, each copy with its own ids: a large input for measuring data preparation."""
    table = pq.read_table(next((source / NAME).glob("*.parquet")))
    (folder / NAME).mkdir(parents=True, exist_ok=True)
    for copy in range(copies):
        ids = pa.array([f"{copy}-{i}" for i in table.column("id").to_pylist()])
        pq.write_table(
            table.set_column(table.schema.get_field_index("id"), "id", ids),
            folder / NAME / f"train-{copy:05d}-of-{copies:05d}.parquet",
        )
    (folder / "README.md").write_text(
        f"---\nconfigs:\n- config_name: {NAME}\n  data_files:\n  - split: train\n"
        f"    path: {NAME}/train-*\n---\n# {copies} copies of {source}\n"
    )
    return folder
