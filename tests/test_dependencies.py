"""Every module the installed package imports is declared in pyproject.toml: a dependency, or an
extra where the code that imports it serves that extra. A module that only arrives with another
dependency today (rich with Ray, safetensors with transformers) is one upgrade away from missing.
The research beside the package (``research/``, not installed) needs the package and its own extra,
``research``, which nothing installed may need."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PACKAGES = ["seqae_errors", "seqae_core", "sweeps", "cluster", "dashboards", "benchmarks", "seqae"]
RESEARCH = "research"  # beside the package: its own extra


def imported(packages: list[str] = PACKAGES) -> dict[str, set[str]]:
    """The top-level modules the files of ``packages`` import, outside the standard library, the
    package and the research: {module: the files that import it}."""
    found: dict[str, set[str]] = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in (*PACKAGES, RESEARCH):
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def undeclared(found: dict[str, set[str]], declared: set[str]) -> dict[str, list[str]]:
    """The modules of ``found`` whose distribution is not among ``declared``, with their files."""
    by_module = packages_distributions()
    missing = {}
    for module, files in found.items():
        # a module not installed here (an extra's, such as the GPU kernels) is named as its distribution
        distributions = {canonicalize_name(d) for d in by_module.get(module, [module])}
        if not distributions & declared:
            missing[module] = sorted(files)
    return missing


def test_every_imported_module_is_declared():
    declared = names(PROJECT["dependencies"]) | {
        n for name, extra in PROJECT["optional-dependencies"].items() if name != RESEARCH for n in names(extra)
    }
    missing = undeclared(imported(), declared)
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"


def test_the_research_needs_the_package_and_its_own_extra_alone():
    """The research (not installed) imports what the package depends on and what its extra,
    ``research``, declares; and each of the extra's modules is one it imports."""
    found = imported([RESEARCH])
    extra = names(PROJECT["optional-dependencies"][RESEARCH])
    missing = undeclared(found, names(PROJECT["dependencies"]) | extra)
    assert missing == {}, f"the research imports what neither the package nor its extra declares: {missing}"
    assert {"scipy", "optuna", "torch"} <= set(found), sorted(found)  # the check sees the research's imports
    assert not undeclared({"scipy": set()}, extra) and undeclared({"scipy": set()}, names(PROJECT["dependencies"]))


def test_the_check_sees_the_imports_it_must():
    found = imported()
    assert {"torch", "ray", "optuna", "mlflow", "rich", "liger_kernel"} <= set(found), sorted(found)
    assert not {"os", "json", "sweeps", "seqae_core"} & set(found)
