"""The research's command lines: ``python -m research.<module> [options]`` runs one experiment,
prints its rows as a table and, with ``--out``, writes them as JSON. Each module names the options
it takes (:func:`parser`); a mistake is refused in one line before anything runs."""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

import pandas as pd

from seqae_errors import ConfigError

# A cell of an experiment's table, as pandas and json write it.
Cell: TypeAlias = str | int | float | bool | None
# A row of a table whose columns are open (one per method, target, budget or grid key): its cells by column.
Row: TypeAlias = dict[str, Cell]
# Any table's rows as they are shown and written: a TypedDict's (a table whose columns are fixed) or open ones.
Rows: TypeAlias = Sequence[Mapping[str, object]]
HELP = {
    "data": "dataset path (default: $SEQAE_BENCH_DATA, else wikimedia/wikipedia from the Hugging Face Hub)",
    "workspace": "where its sweeps and trainings run and stay, so that a rerun continues them (default: a "
    "temporary folder, removed after)",
    "seeds": "the replay seeds, a range FIRST-LAST (default: 0-999, 1,000 replays of each method)",
}


def parser(module: str, doc: str | None, *options: str) -> argparse.ArgumentParser:
    """``python -m research.<module>``'s parser with ``--out`` and each of ``options`` (``data``,
    ``workspace``, ``seeds``), its description the first line of the module's ``doc``."""
    parse = argparse.ArgumentParser(prog=f"python -m research.{module}", description=(doc or "").split("\n")[0])
    parse.add_argument("--out", type=Path, default=None, help="JSON file to write the rows to")
    for option in options:
        parse.add_argument(f"--{option}", default="0-999" if option == "seeds" else None, help=HELP[option])
    return parse


def seeds(text: str) -> range:
    """``--seeds FIRST-LAST`` as a range, refused unless it is one."""
    bounds = re.fullmatch(r"(\d+)(?:-(\d+))?", text)
    found = range(int(bounds[1]), int(bounds[2] or bounds[1]) + 1) if bounds else range(0)
    if not found:
        raise ConfigError(f"--seeds {text!r} is not a range FIRST-LAST of whole numbers (for example 0-999)")
    return found


def data(args: argparse.Namespace) -> str:
    return args.data or os.environ.get("SEQAE_BENCH_DATA") or "wikimedia/wikipedia"


def in_workspace(args: argparse.Namespace, measure: Callable[[Path], Rows]) -> Rows:
    """``measure`` in ``--workspace`` (a rerun continues its sweeps), else in a temporary folder."""
    if args.workspace:
        return measure(Path(args.workspace))
    with tempfile.TemporaryDirectory() as folder:
        return measure(Path(folder))


def show(rows: Rows, out: Path | None) -> None:
    """Print ``rows`` as a table; write them to ``out`` as JSON where it is set."""
    print(pd.DataFrame(rows).to_string(index=False) if rows else "(no rows)")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=1))
        print(f"\nwrote {out}")


def main(run: Callable[[list[str] | None], None], argv: list[str] | None = None) -> None:
    """Run a module's ``run(argv)``, a refusal printed in one line (exit status 2, as ``seqae``'s)."""
    try:
        run(argv)
    except ConfigError as error:
        print(f"error: {error}")
        raise SystemExit(2) from None
