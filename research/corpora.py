"""A second corpus, of a kind unlike Wikipedia, built from text already on the machine: the long
descriptions (READMEs: prose, code, tables, changelogs) of the installed Python packages, written
in the layout of ``wikimedia/wikipedia`` so that ``data.path`` loads it like the offline corpus."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from seqae_core.config import DataConfig

NAME: str = DataConfig.name or ""  # the dataset config the studies load (the data settings' default)


def package_descriptions(folder: Path, min_chars: int = 2000) -> Path:
    """Write one page per installed distribution whose description has at least ``min_chars``
    characters, sorted by name so the corpus is the same on every machine with the same packages."""
    pages: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        text = dist.metadata.get_payload() or dist.metadata.get("Description") or ""  # type: ignore[attr-defined]
        if name and len(text) >= min_chars:
            pages.setdefault(name.lower(), text)
    if len(pages) < 2:
        raise RuntimeError(f"only {len(pages)} installed packages have a description of {min_chars}+ characters")
    names = sorted(pages)
    table = pa.table(
        {
            "id": [str(i) for i in range(len(names))],
            "url": [f"pypi:{n}" for n in names],
            "title": names,
            "text": [pages[n] for n in names],
        }
    )
    (folder / NAME).mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / NAME / "train-00000-of-00001.parquet")
    (folder / "README.md").write_text(
        f"---\nconfigs:\n- config_name: {NAME}\n  data_files:\n  - split: train\n"
        f"    path: {NAME}/train-*\n---\n# {len(names)} installed packages' descriptions\n"
    )
    return folder
