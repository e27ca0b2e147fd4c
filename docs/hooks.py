"""MkDocs hooks: the reference pages are generated from the code when the site builds, so they
cannot drift from it. A page's line ``<!-- generated: NAME -->`` is replaced by :data:`PARTS`'s
NAME: the command line's every verb (from its argparse parser), the config keys (from the config
dataclasses, with the comments beside their fields) and the sweep file's schema (from pydantic)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import typing
from collections.abc import Callable
from typing import Any

from seqae_cli.parser import build_parser
from seqae_core import config as config_lib
from sweeps.spec import SweepSpec


def _commands(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:  # argparse keeps its subcommands here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, f"{path} {name}")
    return found


def cli() -> str:
    """Every verb's ``--help``, as the terminal prints it."""
    parts = []
    for path, parser in _commands(build_parser(), "seqae")[1:]:
        parts.append(f"## `{path}`\n\n```text\n{parser.format_help().strip()}\n```\n")
    return "\n".join(parts)


def _comments(cls: type) -> dict[str, str]:
    """The comment beside (or on the lines just above) each field of a config dataclass."""
    comments, above = {}, []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        field = re.match(r"(\w+): [^=]+=[^#]*(?:#\s*(.*))?$", stripped)
        if field:
            comments[field.group(1)] = " ".join(above + ([field.group(2)] if field.group(2) else []))
        above = []
    return comments


def config_keys() -> str:
    """A table per config section: key, type, default and what it means."""
    parts = []
    for section, cls in config_lib.SECTIONS.items():
        hints, comments = typing.get_type_hints(cls), _comments(cls)
        rows = [f"| `{section}.{f.name}` | `{_type(hints[f.name])}` | `{f.default!r}` | {comments.get(f.name, '')} |"
                for f in dataclasses.fields(cls)]
        parts.append(f"## `{section}`\n\n| key | type | default | meaning |\n| --- | --- | --- | --- |\n"
                     + "\n".join(rows) + "\n")
    return "\n".join(parts)


def _type(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


def sweep_schema() -> str:
    """The sweep file's JSON schema, as pydantic states it."""
    schema = SweepSpec.model_json_schema(by_alias=True)
    return f"```json\n{json.dumps(schema, indent=1)}\n```\n"


PARTS: dict[str, Callable[[], str]] = {"cli": cli, "config-keys": config_keys, "sweep-schema": sweep_schema}


def on_page_markdown(markdown: str, **_: Any) -> str:
    return re.sub(r"<!-- generated: ([\w-]+) -->", lambda m: PARTS[m.group(1)](), markdown)
