"""A benchmark's table as ``seqae bench`` prints it and writes it to JSON: rows keyed by column.

A table whose columns are fixed has a ``TypedDict`` for its row in its own module; these name a
cell and a row whose columns are open (one per case or per figure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

Cell: TypeAlias = str | int | float | bool | None
# Config keys over the defaults, as ``seqae_core.config.from_flat`` reads them.
Settings: TypeAlias = dict[str, str | int | float | bool]
# A row whose columns are open: the cells of one case or figure.
Row: TypeAlias = dict[str, Cell]
# Any table's row as it is printed and written (a TypedDict's, an open one's, a JSON file's).
AnyRow: TypeAlias = Mapping[str, object]
