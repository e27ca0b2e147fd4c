"""The tree's import rules, read from the source with ``ast`` (docs/explanation/architecture.md states them):

- packages point one way, with no exception: ``seqae`` (the API and the command line) on top, and
  nothing imports it; the sweep service imports neither the dashboards nor ``seqae`` (the API hands
  its driver the report);
- no cycle between files;
- inside the sweep service, a module imports only the modules before it in ``SWEEP_ORDER``, which
  keeps its rooms in order (the sweep file, its stores, running it, its results);
- the only function-local imports are ``seqae``'s (the command line's verbs, the API's methods: each
  imports what it uses), and the tokenizer's where a data entry is built, and the s3 extra's boto3
  where an S3 storage is checked (``LAZY_ELSEWHERE``);
- the command line reaches the sweep service only through the API (``seqae.api``), and nothing
  but ``python -m seqae`` imports the command line;
- the research (not installed) reaches seqae only through its API and the seam for simulating a
  sweep on recorded curves (``RESEARCH_REACHES``);
- the ML core needs no sweep machinery, and only the runner and the trial it runs know Ray Tune."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What each package may import of the others, bottom to top (architecture.md's picture, top to bottom).
MAY_IMPORT: dict[str, set[str]] = {
    "seqae_errors": set(),
    "seqae_core": {"seqae_errors"},
    "cluster": {"seqae_errors"},
    "sweeps": {"seqae_errors", "seqae_core"},
    "dashboards": {"seqae_errors", "seqae_core", "cluster", "sweeps"},
    "benchmarks": {"seqae_errors", "seqae_core", "cluster", "dashboards", "sweeps"},
    "seqae": {"seqae_errors", "seqae_core", "cluster", "dashboards", "sweeps", "benchmarks"},
    "research": {"seqae_errors", "seqae_core", "dashboards", "sweeps", "seqae"},
}
# The research uses seqae as a user has it: the ML core, the API and the sweep service's one seam for
# simulating a sweep on recorded curves; and the paper's claims, checked by the report's own rule.
RESEARCH_REACHES = ("seqae.api", "sweeps.running.simulation", "dashboards.claims")
# The top: the API and the command line, whose functions import lazily (each verb and each API
# method what it uses, so that reading a sweep loads little); outside it, only LAZY_ELSEWHERE.
TOP = "seqae"
API = "seqae/api.py"  # the one module of the top that imports the sweep service
CLI = "seqae/cli/"  # the command line, which only `python -m seqae` imports
CLI_STARTER = "seqae/__main__.py"
# ... and one function outside the top, for a trial worker's start-up: building a data entry loads the tokenizer
# ... and boto3 where an s3:// storage is checked: the s3 extra's, absent from an install without it
LAZY_ELSEWHERE = {
    ("seqae_core/data.py", "seqae_core.corpus"),
    ("cluster/artifact_store.py", "boto3"),
    ("cluster/artifact_store.py", "botocore.config.Config"),
    *(("cluster/artifact_store.py", f"botocore.exceptions.{name}") for name in ("BotoCoreError", "ClientError")),
    # ... and IPython where a notebook's live view is shown: a Jupyter kernel's, absent from a plain Python
    *(("sweeps/results/watch.py", f"IPython.{name}") for name in ("get_ipython", "display.HTML", "display.display")),
    # ... and Tune's classes where Ray's private reads need them: `seqae sweep submit` reads Ray's limits there
    # without Tune
    ("sweeps/running/ray_private.py", "ray.tune.execution.tune_controller.TuneController"),
    ("sweeps/running/ray_private.py", "ray.tune.search.Searcher"),
}
NOT_IN_THE_CORE = ("ray", "mlflow", "optuna")
RAY_TUNE_HOMES = (
    "sweeps/running/ray_private.py",
    "sweeps/running/trial.py",
    "sweeps/running/stoppers.py",
    "sweeps/running/schedulers.py",
    "sweeps/running/callbacks.py",
    "sweeps/running/packs.py",
    "sweeps/running/runner.py",
)
# (a trial in its worker; the driver's side of Tune: its stoppers, schedulers, callbacks and the Tuner)
# The sweep service bottom to top, room by room (sweeps/__init__.py): the sweep file, its stores, running it,
# reading its results, then the API over them.
SWEEP_ORDER = [
    "spec.overrides",
    "spec.messages",
    "spec.sections",
    "spec.space",
    "spec.sweep",
    "spec.trial",
    "stores.ownership",
    "stores.workspace",
    "stores.outages",
    "stores.study_storage",
    "stores.shares",
    "stores.queue",
    "stores.narrowing",
    "stores.study_trials",
    "stores.control_channel",
    "stores.continuations",
    "stores.proposals",
    "stores.forks",
    "stores.search",
    "stores.retention",
    "stores.ledger",
    "stores.writer",
    "stores.mlflow_access",
    "stores.mlflow_runs",
    "stores.textmodel",
    "stores.tracking",
    "stores.deletion",
    "running.provenance",
    "running.notify",
    "running.progress",
    "running.system_metrics",
    "running.ray_private",
    "running.ray_connection",
    "running.slots",
    "running.package",
    "running.submit",
    "running.sweep_data",
    "running.tune_result",
    "running.trial",
    "running.stoppers",
    "running.schedulers",
    "running.simulation",
    "running.callbacks",
    "running.packs",
    "running.runner",
    "running.lifecycle",
    "running.driver",
    "results.trials",
    "results.eta",
    "results.plan",
    "results.status",
    "results.remote_status",
    "results.watch",
    "results.export",
    "results.registry",
]
ROOMS = ["spec", "stores", "running", "results"]


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


def target(imp: Import, files: set[str]) -> str | None:
    """The tree's file an import loads (``sweeps/spec/sweep.py`` for ``from sweeps import spec`` and for
    ``from sweeps.spec.sweep import load``), or None for a third-party module."""
    parts = imp.module.split(".")
    for n in range(len(parts), 0, -1):
        for candidate in ("/".join(parts[:n]) + ".py", "/".join(parts[:n]) + "/__init__.py"):
            if candidate in files:
                return candidate
    return None


def sweep_module(module: str) -> str | None:
    """The module of SWEEP_ORDER an import of ``sweeps...`` loads (``stores.search`` for
    ``sweeps.stores.search.SweepStudy``), or None for a room itself."""
    parts = module.split(".")[1:]
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in SWEEP_ORDER), None)


def violations(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        own = imp.file.split("/")[0]
        where = f"{imp.file}:{imp.line} imports {imp.module}"
        if imp.top in MAY_IMPORT and imp.top != own and imp.top not in MAY_IMPORT[own]:
            bad.append(f"{where}: {own} may import only {sorted(MAY_IMPORT[own]) or 'no other package'}")
        if imp.lazy and own != TOP and (imp.file, imp.module) not in LAZY_ELSEWHERE:
            bad.append(
                f"{where} inside a function: only seqae (the API's methods, the command line's verbs) imports lazily"
            )
        if own == TOP and imp.top == "sweeps" and imp.file != API:
            bad.append(f"{where}: the command line reaches the sweep service through seqae.api alone")
        if (
            own == TOP
            and imp.module.startswith("seqae.cli")
            and not imp.file.startswith(CLI)
            and imp.file != CLI_STARTER
        ):
            bad.append(f"{where}: nothing imports the command line but {CLI_STARTER}")
        if (
            own == "research"
            and imp.top in ("sweeps", "dashboards", "seqae")
            and not imp.module.startswith(RESEARCH_REACHES)
        ):
            bad.append(f"{where}: the research reaches seqae through {', '.join(RESEARCH_REACHES)} alone")
        if own == "seqae_core" and imp.top in NOT_IN_THE_CORE:
            bad.append(f"{where}: the ML core runs without {', '.join(NOT_IN_THE_CORE)}")
        if imp.module.startswith("ray.tune") and imp.file not in RAY_TUNE_HOMES:
            bad.append(f"{where}: only {', '.join(RAY_TUNE_HOMES)} talk to Ray Tune")
        if own == "sweeps" and imp.top == "sweeps" and (theirs := sweep_module(imp.module)):
            mine = Path(imp.file).with_suffix("").relative_to("sweeps").as_posix().replace("/", ".")
            if mine in SWEEP_ORDER and SWEEP_ORDER.index(theirs) >= SWEEP_ORDER.index(mine):
                bad.append(f"{where}: inside sweeps, {mine} may import only the modules before it in SWEEP_ORDER")
    return bad


def cycles(found: list[Import], files: set[str]) -> list[list[str]]:
    """Every cycle of the graph of file imports (module-level and lazy alike)."""
    graph: dict[str, set[str]] = {f: set() for f in files}
    for imp in found:
        to = target(imp, files)
        if to and to != imp.file:
            graph[imp.file].add(to)
    seen: set[str] = set()
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(node: str) -> None:
        seen.add(node)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt in on_stack:
                loops.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in seen:
                visit(nxt)
        stack.pop()
        on_stack.discard(node)

    for node in sorted(graph):
        if node not in seen:
            visit(node)
    return loops


def the_tree() -> tuple[list[Import], set[str]]:
    paths = sorted(path for package in MAY_IMPORT for path in (ROOT / package).rglob("*.py"))
    files = {path.relative_to(ROOT).as_posix() for path in paths}
    assert {f.split("/")[0] for f in files} == set(MAY_IMPORT)  # every package was read
    return [imp for path in paths for imp in imports(path.read_text(), path.relative_to(ROOT).as_posix())], files


def test_the_tree_keeps_its_layers():
    tree, files = the_tree()
    assert {imp.file for imp in tree if imp.module.startswith("ray.tune")} == set(RAY_TUNE_HOMES)
    modules = [
        f.removeprefix("sweeps/").removesuffix(".py").replace("/", ".")
        for f in sorted(files)
        if f.startswith("sweeps/") and not f.endswith("__init__.py")
    ]
    assert set(modules) == set(SWEEP_ORDER)  # every module of the sweep service has its place
    rooms = [module.split(".")[0] for module in SWEEP_ORDER]
    assert sorted(rooms, key=ROOMS.index) == rooms  # ... and SWEEP_ORDER keeps each room together, in order
    assert any(imp.lazy for imp in tree if imp.file.startswith(CLI))  # the lazy rule has something to see
    assert any(imp.lazy for imp in tree if imp.file == API)
    # the report reaches the driver from the top, which hands it down: the sweep service never reaches up
    assert [imp.module for imp in tree if imp.file == API and imp.top == "dashboards"]
    assert [imp for imp in tree if imp.file.startswith("sweeps/") and imp.top in ("dashboards", TOP)] == []
    assert violations(tree) == []


def test_no_file_imports_itself_through_others():
    tree, files = the_tree()
    assert sum(1 for imp in tree if target(imp, files)) > 100  # the graph is the tree's, not empty
    assert cycles(tree, files) == []


@pytest.mark.parametrize(
    "file, source, complaint",
    [
        ("sweeps/running/driver.py", "from dashboards import report", "sweeps may import only"),
        ("sweeps/running/driver.py", "from seqae.api import Sweep", "sweeps may import only"),  # the top hands down
        ("dashboards/report/page.py", "from seqae.cli.main import main", "dashboards may import only"),
        ("dashboards/report/page.py", "from seqae import Sweep", "dashboards may import only"),
        ("cluster/local.py", "from seqae_core.config import Config", "cluster may import only ['seqae_errors']"),
        ("seqae_core/train.py", "import mlflow", "the ML core runs without"),
        ("sweeps/running/driver.py", "from ray.tune import Tuner", "talk to Ray Tune"),
        ("sweeps/running/driver.py", "from seqae.cli.main import main", "sweeps may import only"),
        ("benchmarks/run.py", "from seqae.cli import commands", "benchmarks may import only"),
        (
            "sweeps/stores/tracking.py",
            "def f():\n    import torch",
            "only seqae (the API's methods, the command line's verbs) imports lazily",
        ),
        ("seqae_core/train.py", "def f():\n    from seqae_core import corpus", "only seqae (the API's methods"),
        (
            "dashboards/report/page.py",
            "def f():\n    from sweeps.results import export",
            "only seqae (the API's methods",
        ),
        ("seqae/cli/commands.py", "from sweeps.stores.workspace import Workspace", "through seqae.api alone"),
        ("seqae/cli/commands.py", "def f():\n    from sweeps import status", "through seqae.api alone"),
        ("seqae/__init__.py", "from sweeps.running.driver import drive", "through seqae.api alone"),
        ("seqae/api.py", "def f():\n    from seqae.cli import commands", "nothing imports the command line"),
        ("research/replay.py", "from sweeps.running.schedulers import ResumableASHA", "the research reaches"),
        ("research/frontier.py", "from dashboards.report.figures import save_figure", "the research reaches"),
        ("research/replay.py", "from seqae.cli import commands", "the research reaches"),
        ("research/replay.py", "from cluster import local", "research may import only"),
        (
            "sweeps/stores/search.py",
            "from sweeps.running.driver import drive",
            "stores.search may import only the modules",
        ),
        (
            "sweeps/stores/workspace.py",
            "from sweeps.stores import search",
            "stores.workspace may import only the modules",
        ),
        ("sweeps/spec/sections.py", "from sweeps.running import notify", "spec.sections may import only the modules"),
        (
            "sweeps/results/status.py",
            "from sweeps.results.export import trials",
            "results.status may import only the modules",
        ),
    ],
)
def test_each_forbidden_edge_is_caught(file, source, complaint):
    found = violations(imports(source, file))
    assert len(found) == 1 and complaint in found[0], found


def test_a_cycle_between_files_is_caught():
    files = {"sweeps/a.py", "sweeps/b.py", "sweeps/c.py"}
    found = (
        imports("from sweeps import b", "sweeps/a.py")
        + imports("from sweeps.c import x", "sweeps/b.py")
        + imports("import sweeps.a", "sweeps/c.py")
    )
    assert cycles(found, files) == [["sweeps/a.py", "sweeps/b.py", "sweeps/c.py", "sweeps/a.py"]]


@pytest.mark.parametrize(
    "file, source",
    [
        pytest.param(
            "seqae/cli/commands.py", "def bench():\n    from benchmarks.run import SUITES", id="a-verb-lazily"
        ),
        pytest.param(
            "seqae/api.py", "def report():\n    from dashboards.report import page", id="the-api-hands-down-the-report"
        ),
        pytest.param("dashboards/compare.py", "from sweeps.results.export import trials", id="dashboards-read-sweeps"),
        pytest.param(
            "seqae/cli/main.py", "from seqae.api import Sweep\nfrom seqae import api", id="the-cli-uses-the-api"
        ),
        pytest.param(
            "seqae/api.py", "def status():\n    from sweeps.results import status", id="the-api-imports-lazily"
        ),
        pytest.param("seqae/__main__.py", "from seqae.cli.main import main", id="python-m-seqae"),
        pytest.param(
            "research/replay.py",
            "from sweeps.running.simulation import simulate\nfrom seqae import api",
            id="the-research-uses-the-api-and-the-seam",
        ),
    ],
)
def test_an_allowed_edge_passes(file, source):
    assert violations(imports(source, file)) == []


def test_the_command_line_reaches_sweeps_through_its_api_alone():
    tree, _ = the_tree()
    assert {imp.file for imp in tree if imp.top == "sweeps" and imp.file.startswith(f"{TOP}/")} == {API}
    assert any(imp.module.startswith("seqae.api") for imp in tree if imp.file.startswith(CLI))


def test_the_module_map_names_every_module_of_the_product():
    """docs/reference/modules.md is the map of the tree: a module it does not name is one a reader
    cannot find there. A module of a subpackage is named by its path in its package
    (`report/figures`)."""
    page = (ROOT / "docs" / "reference" / "modules.md").read_text()
    modules = [
        path.relative_to(ROOT / package).with_suffix("")
        for package in MAY_IMPORT
        if package not in ("benchmarks", "research")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.stem not in ("__init__", "__main__")
    ]
    assert any(len(module.parts) > 1 for module in modules)  # the subpackages were read
    assert [module.as_posix() for module in modules if f"`{module.as_posix()}`" not in page] == []


def test_the_architecture_page_is_one_screen_whose_picture_is_the_layer_order():
    """docs/explanation/architecture.md fits a screen (40 lines of 100 characters at most), and its
    picture lists the packages top to bottom in the order the rules above enforce."""
    lines = (ROOT / "docs" / "explanation" / "architecture.md").read_text().splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 100, (len(lines), max(map(len, lines)))
    picture = lines[lines.index("```text") + 1 :]
    picture = [line.split()[0] for line in picture[: picture.index("```")]]
    assert picture == list(reversed(MAY_IMPORT)), picture


def test_a_trials_worker_imports_neither_mlflow_nor_optuna_nor_the_tokenizer():
    """Every trial's worker pays its imports as it starts: MLflow's and Optuna's were about 3 of its
    10 CPU-seconds here, the tokenizer's (transformers, datasets) 2.6 of 8.8. The trial's module
    loads training and Ray Tune, and nothing of the driver's; it reads the data entry its driver
    built, and only a missing entry loads the tokenizer (seqae_core.data.build)."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, sweeps.running.trial; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'mlflow', 'optuna', 'torch', 'ray', 'transformers', 'datasets'}))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert loaded.stdout.splitlines()[-1] == "['ray', 'torch']", loaded.stdout + loaded.stderr


def test_import_seqae_loads_no_pytorch_ray_mlflow_optuna_or_report():
    """A notebook's `import seqae` gives the API's names and loads what opening a sweep needs: each
    method imports the rest when it runs (PyTorch, Ray, MLflow and Optuna for a sweep, the report's
    dashboards at its end)."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, seqae; seqae.Sweep, seqae.plan; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'mlflow', 'optuna', 'torch', 'ray', 'transformers', 'datasets', 'matplotlib', 'dashboards'}))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert loaded.stdout.splitlines()[-1] == "[]", loaded.stdout + loaded.stderr
