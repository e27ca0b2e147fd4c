"""The reference pages, generated from the code: the command line's every verb (from its argparse
parser), the config keys (from the config dataclasses, with the comments beside their fields) and
the sweep file's schema (from pydantic).

A page holds each part between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->``,
filled with :data:`PARTS`'s NAME and committed, so that the pages read whole on GitHub too.
``python -m docs.hooks --write`` regenerates them (``--check`` says which are stale, as
``tests/test_reference.py`` does); as an MkDocs hook the site is built from the same text."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from seqae.cli.parser import build_parser
from seqae_core import config as config_lib
from sweeps.spec.sections import Distribution
from sweeps.spec.sweep import SweepSpec


def _commands(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:  # argparse keeps its subcommands here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, f"{path} {name}")
    return found


HELP_WIDTH = 100  # the help's line width, fixed: argparse would take the terminal's, and the pages would differ


def cli() -> str:
    """Every verb's ``--help``, as a terminal HELP_WIDTH columns wide prints it."""
    parts = []
    for path, parser in _commands(build_parser(), "seqae")[1:]:
        parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=HELP_WIDTH)
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
        rows = [
            f"| `{section}.{f.name}` | `{_type(hints[f.name])}` | `{f.default!r}` | {comments.get(f.name, '')} |"
            for f in dataclasses.fields(cls)
        ]
        parts.append(
            f"## `{section}`\n\n| key | type | default | meaning |\n| --- | --- | --- | --- |\n"
            + "\n".join(rows)
            + "\n"
        )
    return "\n".join(parts)


def _type(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Union:  # a union of Annotated types (the config's), as `X | Y` is written
        return " | ".join("None" if arg is type(None) else _type(arg) for arg in typing.get_args(hint))
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


def _model(annotation: Any) -> type[BaseModel] | None:
    """The section model a field holds, through ``X | None``, ``tuple[X, ...]`` and ``dict[str, X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model, typing.get_args(annotation)) if m is not None), None)


def _literal(annotation: Any) -> tuple[Any, ...]:
    """The values a ``Literal`` allows, through ``X | None`` and ``tuple[X, ...]``; () for other types."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return next((v for v in map(_literal, typing.get_args(annotation)) if v), ())


def _kind(info: FieldInfo) -> str:
    """The field's type (a section's, the values a Literal allows; a pipe would end the table's
    cell), then its bounds."""
    annotation, listed = info.annotation, typing.get_origin(info.annotation) is tuple
    section, values = _model(annotation), _literal(annotation)
    if section is not None and section is not Distribution:
        kind = "a section" + (", or a list of them" if listed else "")
    elif values:
        kind = ("a list of " if listed else "one of ") + ", ".join(f"`{v}`" for v in values)
    else:
        text = re.sub(r"\b[\w.]+\.", "", _type(annotation)).replace(" | ", " or ")
        kind = "`" + re.sub(r"tuple\[(.*?), \.\.\.\]", r"list[\1]", text) + "`"  # YAML has lists
    bounds = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "at least"}
    limits = [
        f"{sign} {getattr(m, name)}"
        for m in info.metadata
        for name, sign in bounds.items()
        if getattr(m, name, None) is not None
    ]
    return ", ".join([kind] + limits)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return f"`{value.model_dump(exclude_none=True, by_alias=True)}`"
    if isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
        return f"`{[v.model_dump(exclude_none=True) for v in value]}`"
    return f"`{value!r}`" if value not in ((), {}) else "none"


def sweep_fields(model: type[BaseModel] = SweepSpec, prefix: str = "") -> list[tuple[str, FieldInfo]]:
    """Every key of a sweep file, sections' keys after their section's: ``scheduler.type``,
    ``search.KEY.low``, ``objective.metric``."""
    found = []
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        found.append((key, info))
        section = _model(info.annotation)
        if section is not None:
            mapped = typing.get_origin(info.annotation) is dict
            found += sweep_fields(section, f"{key}.KEY." if mapped else f"{key}.")
    return found


def sweep_keys() -> str:
    """A table of every sweep-file key: its type, default, allowed values and meaning, from the
    schema's field descriptions."""
    rows = [f"| `{key}` | {_kind(info)} | {_default(info)} | {info.description} |" for key, info in sweep_fields()]
    return "| key | type or values | default | meaning |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"


PARTS: dict[str, Callable[[], str]] = {"cli": cli, "config-keys": config_keys, "sweep-keys": sweep_keys}
REFERENCE = Path(__file__).resolve().parent / "reference"
PAGES = {
    name: REFERENCE / page
    for name, page in (("cli", "cli.md"), ("config-keys", "config-keys.md"), ("sweep-keys", "sweep-schema.md"))
}
_PART = re.compile(
    r"<!-- generated: ([\w-]+) -->\n.*?<!-- end generated: \1 -->\n|<!-- generated: ([\w-]+) -->\n?", re.S
)


def render(markdown: str) -> str:
    """``markdown`` with each generated part made anew from the code (a bare start marker gets its
    part and an end marker)."""

    def part(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return f"<!-- generated: {name} -->\n{PARTS[name]()}<!-- end generated: {name} -->\n"

    return _PART.sub(part, markdown)


def stale() -> list[Path]:
    """The committed reference pages whose generated parts differ from what the code makes now."""
    return [page for page in PAGES.values() if render(page.read_text()) != page.read_text()]


def on_page_markdown(markdown: str, **_: Any) -> str:
    return render(markdown)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        for page in PAGES.values():
            page.write_text(render(page.read_text()))
            print(page)
    elif sys.argv[1:] == ["--check"]:
        pages = stale()
        for page in pages:
            print(f"{page}: stale; python -m docs.hooks --write", file=sys.stderr)
        sys.exit(1 if pages else 0)
    else:
        sys.exit("usage: python -m docs.hooks --write | --check")
