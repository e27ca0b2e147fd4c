"""The house's counts, for a before and after of a refactor: `python -m research.house` from a
checkout's root. Package imports between seqae's packages (and any cycle of two), `dict[str, Any]`
and bare `Any` in function signatures (a border's name from ``seqae_core/borders.py`` counts as the
``dict[str, Any]`` it stands for, and is tallied by name), modules over 400 lines, functions over 80
lines, and lines of Python by package. It reads the source with ``ast`` and imports none of it, so it counts an older
checkout as well (run it there)."""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path.cwd()
PACKAGES = [
    p
    for p in (
        "seqae_errors",
        "seqae_core",
        "cluster",
        "sweeps",
        "dashboards",
        "benchmarks",
        "seqae_cli",
        "seqae",
        "research",
    )
    if (ROOT / p).is_dir() and any((ROOT / p).rglob("*.py"))
]


def files(pkg: str) -> list[Path]:
    return sorted(p for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def border_names() -> list[str]:
    """The names ``seqae_core/borders.py`` gives ``dict[str, Any]`` (none in a checkout before it)."""
    path = ROOT / "seqae_core" / "borders.py"
    if not path.exists():
        return []
    return [
        node.target.id
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.value is not None
        and ast.unparse(node.value) == "dict[str, Any]"
    ]


BORDERS = border_names()


def sig_counts(tree: ast.AST, borders: Counter[str]) -> tuple[int, int]:
    dict_any = bare_any = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            anns = [
                a.annotation
                for a in (
                    *node.args.posonlyargs,
                    *node.args.args,
                    *node.args.kwonlyargs,
                    *([node.args.vararg] if node.args.vararg else []),
                    *([node.args.kwarg] if node.args.kwarg else []),
                )
            ] + [node.returns]
            for ann in anns:
                if ann is None:
                    continue
                text = ast.unparse(ann)
                dict_any += text.count("dict[str, Any]") + text.count("Dict[str, Any]")
                for sub in ast.walk(ann):
                    if isinstance(sub, ast.Name) and sub.id == "Any":
                        bare_any += 1
                bare_any -= text.count("dict[str, Any]") + text.count("Dict[str, Any]")
                for sub in ast.walk(ann):
                    if isinstance(sub, ast.Name) and sub.id in BORDERS:
                        borders[sub.id] += 1
                        dict_any += 1
    return dict_any, bare_any


def main() -> None:
    print("packages:", PACKAGES)
    dict_any: Counter[str] = Counter()
    bare_any: Counter[str] = Counter()
    borders: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    big_modules: list[tuple[int, str]] = []
    big_functions: list[tuple[int, str]] = []
    edges: dict[str, set[str]] = defaultdict(set)
    for pkg in PACKAGES:
        for f in files(pkg):
            src = f.read_text()
            tree = ast.parse(src)
            n = len(src.splitlines())
            lines[pkg] += n
            if n > 400:
                big_modules.append((n, str(f.relative_to(ROOT))))
            d, a = sig_counts(tree, borders)
            dict_any[pkg] += d
            bare_any[pkg] += a
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > 80:
                        big_functions.append((length, f"{f.relative_to(ROOT)}:{node.lineno} {node.name}"))
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in PACKAGES and top != pkg:
                        edges[pkg].add(top)
    print("package imports:", {k: sorted(v) for k, v in sorted(edges.items())})
    cycles = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, set())})
    print("two-package cycles:", cycles or "none")
    print("dict[str, Any] in signatures:", sum(dict_any.values()), dict(dict_any))
    print("  of which a library's, by its name in seqae_core/borders.py:", sum(borders.values()), dict(borders))
    print("bare Any in signatures:", sum(bare_any.values()), dict(bare_any))
    print("modules over 400 lines:", len(big_modules))
    for n, where in sorted(big_modules, reverse=True):
        print(f"  {n:5d} {where}")
    print("functions over 80 lines:", len(big_functions))
    for n, where in sorted(big_functions, reverse=True):
        print(f"  {n:5d} {where}")
    print("lines by package:", dict(lines), "total", sum(lines.values()))


if __name__ == "__main__":
    main()
