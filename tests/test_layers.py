"""The packages' layers, read from the source with ``ast``: no package imports one above it, the
ML core needs no sweep machinery, and only the runner knows Ray Tune."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What each package may import of the others, bottom to top.
MAY_IMPORT: dict[str, set[str]] = {
    "seqae_errors": set(),
    "seqae_core": {"seqae_errors"},
    "cluster": {"seqae_errors"},
    "dashboards": {"seqae_errors", "seqae_core", "cluster"},
    "sweeps": {"seqae_errors", "seqae_core", "dashboards"},
    "benchmarks": {"seqae_errors", "seqae_core", "sweeps"},
}
ENTRY_POINT = "sweeps/cli.py"  # the `seqae` command: any package, imported inside the verb that needs it
NOT_IN_THE_CORE = ("ray", "mlflow", "optuna")
RAY_TUNE_HOME = "sweeps/runner.py"


@dataclass(frozen=True)
class Import:
    file: str
    line: int
    module: str
    lazy: bool  # inside a function: loaded only when that code runs

    @property
    def top(self) -> str:
        return self.module.split(".")[0]


def imports(source: str, file: str) -> list[Import]:
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(file, child.lineno, alias.name, lazy) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.extend(Import(file, child.lineno, f"{child.module}.{alias.name}", lazy) for alias in child.names)
            visit(child, inner)

    visit(ast.parse(source), False)
    return found


def violations(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        own = imp.file.split("/")[0]
        where = f"{imp.file}:{imp.line} imports {imp.module}"
        if imp.top in MAY_IMPORT and imp.top != own and imp.top not in MAY_IMPORT[own]:
            if not (imp.file == ENTRY_POINT and imp.lazy):
                bad.append(f"{where}: {own} may import only {sorted(MAY_IMPORT[own]) or 'no other package'}")
        if own == "seqae_core" and imp.top in NOT_IN_THE_CORE:
            bad.append(f"{where}: the ML core runs without {', '.join(NOT_IN_THE_CORE)}")
        if imp.module.startswith("ray.tune") and imp.file != RAY_TUNE_HOME:
            bad.append(f"{where}: only {RAY_TUNE_HOME} talks to Ray Tune")
    return bad


def test_the_tree_keeps_its_layers():
    files = sorted(path for package in MAY_IMPORT for path in (ROOT / package).rglob("*.py"))
    assert {path.relative_to(ROOT).parts[0] for path in files} == set(MAY_IMPORT)  # every package was read
    tree = [imp for path in files for imp in imports(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert any(imp.file == RAY_TUNE_HOME and imp.module.startswith("ray.tune") for imp in tree)
    assert violations(tree) == []


@pytest.mark.parametrize("file, source, complaint", [
    ("dashboards/report.py", "from sweeps.tracking import Tracker", "dashboards may import only"),
    ("cluster/local.py", "from seqae_core.config import Config", "cluster may import only ['seqae_errors']"),
    ("seqae_core/train.py", "def f():\n    import mlflow", "the ML core runs without"),
    ("sweeps/service.py", "from ray.tune import Tuner", "only sweeps/runner.py talks to Ray Tune"),
    ("sweeps/cli.py", "from benchmarks.run import SUITES", "sweeps may import only"),  # at import time
])
def test_each_forbidden_edge_is_caught(file, source, complaint):
    found = violations(imports(source, file))
    assert len(found) == 1 and complaint in found[0], found


def test_the_command_line_may_import_a_verb_lazily():
    assert violations(imports("def bench():\n    from benchmarks.run import SUITES", ENTRY_POINT)) == []
