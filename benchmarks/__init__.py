"""seqae's benchmarks: each module a ``seqae bench`` command; the published tables beside them."""

from pathlib import Path

TABLES = Path(__file__).resolve().parent / "tables"
