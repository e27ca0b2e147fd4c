"""Where a run's files live: a local folder, or a folder every node reaches, or an object store
(``s3://bucket/prefix``, ``gs://...``) through pyarrow's filesystems, which also read the usual
credentials and endpoint settings (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path)`` for a local path or a URI such as ``s3://bucket/prefix``."""
    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)
    return pafs.LocalFileSystem(), str(Path(uri).expanduser().resolve())
