"""A sweep file as a document, before its schema (:mod:`sweeps.spec.sweep`) validates it: the YAML read
with limits, and the override language of ``--set`` and of the file's profiles, which rewrite the
document (a pinned config key leaves the grid, the search and the starting points)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

from seqae_core.borders import Document
from seqae_core.config import KEYS, flatten, load_yaml, parse_sets
from seqae_errors import ConfigError

MAX_FILE_BYTES = 256 * 1024  # sweep files are documents, not data


def read_document(path: str | Path, keys: list[str]) -> Document:
    """The YAML mapping in ``path`` (a sweep file, whose top-level ``keys`` an error lists),
    refusing files that are large or use aliases."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if size > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: {size} bytes is too large for a sweep file (limit {MAX_FILE_BYTES})")
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a valid sweep file: {exc}") from None
    document = load_yaml(text, f"{path}: not a valid sweep file")
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: a sweep file is a mapping of {', '.join(keys)}; got {type(document).__name__}")
    return mapping(document, "the document", str(path))


def apply_sets(
    document: Mapping[str, object], sets: list[str] | tuple[str, ...], source: str, keys: list[str]
) -> Document:
    """``--set`` overrides on a sweep document.

    ``data.* / model.* / train.*`` pin a config key: it is set in ``config`` and leaves the grid,
    the search and the starting points. Other keys address the document itself: ``trials.total=2``,
    ``max_concurrent=2``, ``grid.data.input_len=[16,32]``, ``search.train.lr={...}``, and
    ``profile=laptop`` applies the file's profile of that name (the CLI's ``--profile``).
    ``keys`` are the sweep file's top-level keys."""
    return _override(document, parse_sets(sets), source, "--set ", keys)


def _override(
    document: Mapping[str, object], overrides: Mapping[str, object], source: str, label: str, keys: list[str]
) -> Document:
    doc: Document = copy.deepcopy(dict(document))
    for key, value in overrides.items():
        where = f"{label}{key}"
        section = key.split(".", 1)[0]
        if key == "profile":
            doc = apply_profile(doc, value, source, keys)
        elif key in KEYS or section in ("data", "model", "train"):
            doc.setdefault("config", {})
            if not isinstance(doc["config"], dict):
                raise ConfigError(f"{source}: config must be a mapping")
            doc["config"] = {**flatten(doc["config"], source), key: value}
            if isinstance(doc.get("start"), dict):  # a pinned key holds for the starting points too
                doc["start"] = {
                    name: {k: v for k, v in flatten(point, source).items() if k != key}
                    if isinstance(point, dict)
                    else point
                    for name, point in doc["start"].items()
                }
            for axis in ("grid", "search"):
                if isinstance(doc.get(axis), dict):
                    doc[axis].pop(key, None)
                    zipped = [a for a in doc[axis] if key in str(a).split(",")]
                    if zipped:
                        raise ConfigError(
                            f"{where}: {key} is part of the zipped grid axis {zipped[0]!r} in "
                            f"{source}; set the whole axis with grid.{zipped[0]}=[[...]]"
                        )
        elif section in ("grid", "search") and "." in key:
            doc.setdefault(section, {})
            if not isinstance(doc[section], dict):
                raise ConfigError(f"{source}: {section} must be a mapping")
            doc[section][key.split(".", 1)[1]] = value
        elif section not in keys:  # named as given, not as the section `ata` that `ata.input_len` would add
            raise ConfigError(
                f"{where}: unknown key {section!r}; set a config key (data.*, model.*, train.*) or one "
                f"of {', '.join(keys)}"
            )
        else:
            node = doc
            *parents, last = key.split(".")
            for name in parents:
                node = node.setdefault(name, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"{where}: {name} is not a mapping in {source}")
            node[last] = value
    return doc


def apply_profile(document: Mapping[str, object], name: object, source: str, keys: list[str]) -> Document:
    """The document with its profile ``name`` applied: the profile's keys are overrides of the same
    form as ``--set``; its ``description`` is added to the sweep's."""
    doc: Document = dict(document)
    profiles = doc.pop("profiles", None) or {}
    if not isinstance(profiles, dict):
        raise ConfigError(f"{source}: profiles must map names to blocks of overrides, got {profiles!r}")
    if doc.get("profile"):
        raise ConfigError(f"{source}: profile={name!r}: profile {doc['profile']!r} is already applied; one at a time")
    if not isinstance(name, str) or name not in profiles:
        raise ConfigError(
            f"{source}: profile={name!r} is not defined; this file's profiles: "
            f"{', '.join(map(str, profiles)) or 'none'}"
        )
    overrides = dict(mapping(profiles[name], f"profiles.{name}", source))
    note = overrides.pop("description", "")
    if not isinstance(note, str):
        raise ConfigError(f"{source}: profiles.{name}.description must be text")
    doc = _override(doc, overrides, source, f"{source}: profiles.{name}.", keys)
    doc["profile"] = name
    doc["description"] = (
        f"{doc.get('description', '')} [profile {name}: {note}]" if note else doc.get("description", "")
    )
    return doc


def mapping(value: object, where: str, source: str) -> dict[str, object]:
    """``value`` if it is a mapping with string keys; ``where`` names it in the error."""
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {where} must be a mapping; got {value!r}")
    keys = [key for key in value if not isinstance(key, str)]
    if keys:
        raise ConfigError(f"{source}: {where}: key {keys[0]!r} must be a string")
    return value
