"""No input crashes the parser: a generated sweep file or ``--set`` value either gives a spec that
validates (and reloads from its stored form), or a ConfigError of one line that names what is
wrong; the command line exits 2 with that line and creates nothing.

The inputs are built from the real schema: each study in sweeps/studies with one fault injected (a
misspelled or unknown key, a wrong type, a non-finite, huge or negative number, deep nesting, a huge
string, a condition or a starting point naming a key nothing searches), real files with lines
dropped, repeated or garbled, and ``--set`` items of real and near-miss keys. Examples are drawn
from a fixed seed (``derandomize``), so CI tests the same ones every run.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from seqae.cli.main import main
from seqae_core import config as config_lib
from seqae_core.config import KEYS
from seqae_errors import ConfigError
from sweeps.spec import sweep as spec_lib
from sweeps.stores import proposals

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # TPE's pinned settings

STUDIES = sorted((Path(__file__).resolve().parents[1] / "sweeps" / "studies").glob("*.yaml"))
DOCUMENTS = [yaml.safe_load(path.read_text()) for path in STUDIES]

# Every name the schema knows: the sweep file's keys and those of its sections (from the schema
# pydantic states), the config keys, dotted and by field; the faults misspell these.
SCHEMA = spec_lib.SweepSpec.model_json_schema(by_alias=True)
FIELDS = {name for part in SCHEMA["$defs"].values() for name in part.get("properties", {})}
NAMES = sorted(set(SCHEMA["properties"]) | FIELDS | set(KEYS) | {key.split(".", 1)[1] for key in KEYS})
# What `--set` addresses besides config keys: `trials.total`, `scheduler.type`, ..., and the sections.
SETTINGS = sorted(
    {
        f"{top}.{name}"
        for top, prop in SCHEMA["properties"].items()
        for ref in re.findall(r"#/\$defs/(\w+)", json.dumps(prop))
        for name in SCHEMA["$defs"][ref].get("properties", {})
    }
    | set(SCHEMA["properties"])
    | {"profile"}
)


def fuzz(examples: int) -> settings:
    """Hypothesis settings of this file: ``examples`` drawn from a fixed seed, no example database."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


@st.composite
def near_miss(draw: st.DrawFn) -> str:
    """A real name one slip away: a letter dropped, doubled or changed, two swapped, a case or separator wrong."""
    name = draw(st.sampled_from(NAMES))
    i = draw(st.integers(0, len(name) - 1))
    slip = draw(st.sampled_from(["drop", "double", "swap", "letter", "upper", "separator"]))
    if slip == "drop":
        return name[:i] + name[i + 1 :]
    if slip == "double":
        return name[:i] + name[i] + name[i:]
    if slip == "swap":
        return name[:i] + name[i + 1 : i + 2] + name[i] + name[i + 2 :]
    if slip == "letter":
        return name[:i] + draw(st.sampled_from("aeiouxz_.")) + name[i + 1 :]
    if slip == "upper":
        return name.upper()
    return name.replace("_", "-").replace(".", "_")


KEY_TEXT = st.text(min_size=1, max_size=12)
A_KEY = near_miss() | st.sampled_from(NAMES) | KEY_TEXT

NUMBERS = (
    st.sampled_from(
        [
            math.nan,
            math.inf,
            -math.inf,
            1e308,
            -1e308,
            5e-324,
            0.0,
            -0.0,
            -1.5,
            0.5,
            1.0,
            0,
            1,
            -1,
            2,
            2**31,
            2**63,
            10**30,
            -(10**30),
        ]
    )
    | st.integers()
    | st.floats()
)
SCALARS = st.none() | st.booleans() | NUMBERS | st.text(max_size=20) | st.dates()
HUGE_TEXT = st.builds(lambda n, c: c * n, st.integers(1_000, 40_000), st.sampled_from(["x", "\n", "é", " #", "'"]))


def _nest(value: Any, depth: int, in_mapping: bool) -> Any:
    for _ in range(depth):
        value = {"a": value} if in_mapping else [value]
    return value


DEEP = st.builds(_nest, SCALARS, st.integers(5, 60), st.booleans())
VALUES = (
    st.recursive(
        SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(A_KEY, inner, max_size=3), max_leaves=6
    )
    | HUGE_TEXT
    | DEEP
)


def _places(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Every entry of a document as (its container's path, its key or index)."""
    entries = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    return [place for key, value in entries for place in [(path, key), *_places(value, (*path, key))]]


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _names(path: tuple[Any, ...], key: Any) -> set[str]:
    """What names an entry: its key; a list's entry, its list's key or that one's owner (a choice
    of search.model.d_model is named by choices or model.d_model); a zipped grid axis, each key in
    it; a profile's ``grid.model.d_model``, model.d_model."""
    names = [k for k in (*path, key) if isinstance(k, str)]
    return {
        part
        for name in (names[-1:] if isinstance(key, str) else names[-2:])
        for part in (name, name.partition(".")[2], *name.split(","))
    }


def _shown(value: Any) -> set[str]:
    """How a message may show ``value``."""
    return set() if isinstance(value, (list, dict)) else {repr(value)[:20], str(value)[:20]}


@st.composite
def faulty_documents(draw: st.DrawFn) -> tuple[dict[str, Any], set[str], tuple[str, tuple[Any, ...]]]:
    """A real study with one fault injected, the names a message about that fault may name, and the
    fault: its kind and where it is (``("drop", ("config", "data", "test_fraction"))``)."""
    doc = yaml.safe_load(yaml.safe_dump(draw(st.sampled_from(DOCUMENTS))))  # a copy
    places = _places(doc)
    fault = draw(st.sampled_from(["value", "number", "misspell", "unknown", "drop", "condition", "start"]))
    if fault == "number":  # a number made extreme, non-finite, negative or zero
        numbers = [(path, key) for path, key in places if type(_at(doc, (*path, key))) in (int, float)]
        path, key = draw(st.sampled_from(numbers))
        _at(doc, path)[key] = value = draw(NUMBERS)
        return doc, _names(path, key) | _shown(value), (fault, (*path, key))
    if fault in ("value", "misspell", "drop"):
        path, key = draw(st.sampled_from(places))
        container = _at(doc, path)
        if fault == "value" or not isinstance(container, dict):
            value = draw(VALUES)
            container[key] = value
            return doc, _names(path, key) | _shown(value), ("value", (*path, key))
        value = container.pop(key)
        if fault == "drop":
            return doc, _names(path, key), (fault, (*path, key))
        wrong = draw(near_miss())
        container[wrong] = value
        return doc, {wrong}, (fault, (*path, wrong))
    if fault == "unknown":
        mappings = [()] + [(*path, key) for path, key in places if isinstance(_at(doc, (*path, key)), dict)]
        path = draw(st.sampled_from(mappings))
        key = draw(A_KEY)
        _at(doc, path)[key] = draw(VALUES)
        return doc, {key}, (fault, (*path, key))
    key = draw(near_miss() | st.sampled_from(KEYS) | KEY_TEXT)
    value = draw(VALUES | st.sampled_from(["paper", "transformer", 64, 1e-3]))
    if fault == "condition":  # a searched key sampled only under a key that may be searched by nothing
        searched = doc.setdefault("search", {"train.weight_decay": {"type": "uniform", "low": 0.0, "high": 0.1}})
        searched[draw(st.sampled_from(sorted(searched)))]["when"] = {key: value}
        return doc, {key, "when", *_shown(value)}, (fault, ("when", key))
    name = draw(st.sampled_from(["paper", "defaults", "x"]) | KEY_TEXT)
    doc.setdefault("start", {})
    doc["start"] = {**(doc["start"] if isinstance(doc["start"], dict) else {}), name: {key: value}}
    return doc, {key, "start", *_shown(value), *_shown(name)}, (fault, ("start", name, key))


@st.composite
def garbled_texts(draw: st.DrawFn) -> str:
    """A real study's text with lines dropped, repeated, swapped, cut or replaced by random text."""
    lines = draw(st.sampled_from(STUDIES)).read_text().splitlines()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        edit = draw(st.sampled_from(["drop", "repeat", "swap", "cut", "insert", "indent"]))
        if edit == "drop":
            del lines[i]
        elif edit == "repeat":
            lines.insert(i, lines[i])
        elif edit == "swap":
            lines[i], lines[-1 - i] = lines[-1 - i], lines[i]
        elif edit == "cut":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif edit == "insert":
            lines.insert(
                i,
                draw(
                    st.text(max_size=40)
                    | st.sampled_from(
                        [
                            "- x",
                            "? [a]",
                            "a: &x 1",
                            "b: *x",
                            "{",
                            "[",
                            ": :",
                            "\t",
                            "!!python/object:os.system x",
                            "!!int x",
                            "!!bool maybe",
                            "when: 2024-13-45",
                            "n: " + "9" * 5000,
                            "x: " + "[" * 40,
                        ]
                    )
                ),
            )
        else:
            lines[i] = "  " + lines[i]
    return "\n".join(lines)


FITTING = st.sampled_from(["1", "2", "16", "64", "0.5", "1e-3", "paper", "transformer", "laptop", "null", "true"])
SET_VALUES = (
    FITTING
    | st.sampled_from(
        [
            "nan",
            "-inf",
            "inf",
            "1e999",
            "-1e999",
            "0",
            "-1",
            "1e-400",
            "0x10",
            "1_000",
            "2.5",
            "",
            " ",
            "9" * 5000,
            "[" * 40 + "]" * 40,
            "{a",
            "[1, 2",
            "{a: [}",
            "[&a 1, *a]",
            "[!!int x]",
            "{type: asha}",
            "{type: [tpe]}",
            "[0.5, .nan]",
        ]
    )
    | st.builds(lambda v: yaml.safe_dump(v, default_flow_style=True, width=math.inf).strip(), VALUES)
    | st.text(max_size=30)
)
SET_KEYS = (
    st.sampled_from(KEYS)
    | st.sampled_from(SETTINGS)
    | near_miss()
    | st.builds("{}.{}".format, st.sampled_from(["grid", "search"]), st.sampled_from(KEYS) | near_miss())
    | KEY_TEXT
)
SET_ITEMS = (
    st.builds("{}={}".format, st.sampled_from([*KEYS, *SETTINGS]), FITTING)  # a value that may fit
    | st.builds("{}={}".format, SET_KEYS, SET_VALUES)
    | st.text(max_size=20)
)


def check_refusal(error: ConfigError, names: set[str] | None = None) -> None:
    """One line, naming one of ``names`` (or, for what YAML cannot read, where in the text it is)."""
    message = str(error)
    event("refused")
    assert message and "\n" not in message and "\r" not in message, f"not one line: {message!r}"
    if names is not None:
        named = (
            [n for n in names if n and (n in message or repr(n)[1:-1] in message)]  # as is, or quoted
            or re.findall(r"line \d+, column \d+", message)
        )
        assert named, f"names none of {sorted(names)}: {message}"


def check_spec(spec: spec_lib.SweepSpec) -> None:
    """A spec that validates: it reloads from the form stored with a sweep, its notes can be told,
    and Optuna takes its sampler's settings."""
    event("valid")
    assert spec_lib.parse(spec.to_dict(), spec.source) == spec
    spec.notes()
    spec.fingerprint()
    proposals.sampler(spec, spec.planned_trials())


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def write(folder: Path, doc: object) -> Path:
    path = folder / "sweep.yaml"
    # without allow_unicode: with it, PyYAML writes a "\x85" in a key as it is, and reads it back as a space
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def may_be_valid(fault: tuple[str, tuple[Any, ...]]) -> bool:
    """Whether a file with this fault can be a valid one: a value replaced by one that fits, an
    optional key dropped, a start or a profile named anew (their names are the file's to choose), a
    key added that the schema knows. A misspelled or unknown key elsewhere, a condition or a
    starting point naming what nothing searches, can never be."""
    kind, place = fault
    return (
        kind in ("value", "number", "drop")
        or kind in ("misspell", "unknown")
        and (place[:1] in (("start",), ("profiles",)) and len(place) == 2 or place[-1] in NAMES)
    )


def test_a_sweep_file_with_a_fault_gives_a_spec_or_one_line_naming_it(folder):
    accepted: list[tuple[str, tuple[Any, ...]]] = []  # the faulty files the parser took

    @fuzz(100)
    @given(faulty=faulty_documents())
    def one(faulty: tuple[dict[str, Any], set[str], tuple[str, tuple[Any, ...]]]) -> None:
        doc, names, fault = faulty
        try:
            spec = spec_lib.load(write(folder, doc))
        except ConfigError as error:
            check_refusal(error, names)
            return
        check_spec(spec)
        accepted.append(fault)

    one()
    # Taking a faulty file is right only where the fault may leave a valid one; and most faults
    # cannot (12 of these 100 examples are taken with Hypothesis 6.170, the other 88 refused): a parser
    # that took what it should refuse passes every check above, and fails here.
    assert [fault for fault in accepted if not may_be_valid(fault)] == [], accepted
    assert len(accepted) <= 20, accepted


@fuzz(60)
@given(text=garbled_texts())
# Crashes found so far, each tried on every run:
@example(text="grid: {1: [16, 32]}")  # AttributeError: a key that is not text
@example(text="sampler: {type: [tpe]}")  # TypeError: a list looked up in a dict
@example(
    text="search: {train.seed: {type: int, low: 0, high: 1}, train.lr: {type: uniform, low: 0.1, high: 1, "
    "when: {train.seed: []}}}"
)  # IndexError
@example(text="profiles: {laptop: {1: 2}}")  # AttributeError
@example(text="config: {data: {path: ~nosuchuser/x}}")  # RuntimeError from Path.expanduser
@example(text=f"config: {{data: {{path: {'x' * 5000}}}}}")  # OSError: a name too long for a path
@example(text=f"trials: {{total: {'1' * 5000}}}")  # ValueError: more digits than int() reads
@example(text="description: 2024-13-45")  # ValueError from datetime
@example(text="config: " + "[" * 5000 + "]" * 5000)  # RecursionError in PyYAML's composer
@example(text="config: {train: {epochs: 1000000000000000}}\nscheduler: {type: asha}")  # notes() looped for ever
def test_a_garbled_sweep_file_gives_a_spec_or_one_line(folder, text):
    try:
        spec = spec_lib.load(write(folder, text))
    except ConfigError as error:
        check_refusal(error)
        return
    check_spec(spec)


@fuzz(150)
@given(study=st.sampled_from(STUDIES), items=st.lists(SET_ITEMS, min_size=1, max_size=3))
@example(study=STUDIES[0], items=["profile=[laptop]"])  # TypeError: a list looked up in a dict
@example(study=STUDIES[0], items=["sampler.seed=-1"])  # parsed, then numpy refused to seed the sampler
@example(study=STUDIES[0], items=["description=" + "[" * 5000 + "]" * 5000])  # RecursionError in PyYAML's composer
def test_set_values_give_a_spec_or_one_line(study, items):
    for load in (lambda: spec_lib.load(study, items), lambda: config_lib.load(None, items)):
        try:
            loaded = load()
        except ConfigError as error:
            check_refusal(error)
            continue
        if isinstance(loaded, spec_lib.SweepSpec):
            check_spec(loaded)


@fuzz(12)
@given(faulty=faulty_documents(), items=st.lists(SET_ITEMS, max_size=2))
def test_the_command_line_refuses_a_bad_file_with_one_line_and_exit_2(folder, faulty, items):
    path = write(folder, faulty[0])
    try:
        spec_lib.load(path, items)
    except ConfigError:
        pass
    else:
        assume(False)  # a valid sweep would start: this test is about refusals
    workspace = folder / "workspace"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["sweep", "run", str(path), "--workspace", str(workspace), *[f"--set={item}" for item in items]])
    lines = err.getvalue().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("seqae: error: "), err.getvalue()
    assert not workspace.exists()
