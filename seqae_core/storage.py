"""Where a run's files live: a local folder, or a folder every node reaches, or an object store
(``s3://bucket/prefix``, ``gs://...``) through pyarrow's filesystems, which also read the usual
credentials and endpoint settings (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path)`` for a local path or a URI such as ``s3://bucket/prefix``."""
    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)
    return pafs.LocalFileSystem(), str(Path(uri).expanduser().resolve())


def write_atomically(path: Path, data: bytes) -> None:
    """Replace the local file ``path`` by ``data``: readers, and a process killed meanwhile, see the
    old file or the new one, never half of one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_bytes(data)
    os.replace(temporary, path)
