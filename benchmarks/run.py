"""``seqae bench``: run the benchmarks side by side, print one table each, write one JSON file. Each
measures this machine (its speed, its GPU, its data preparation, the control plane at scale); the
experiments behind the docs' claims are the research's, beside the package (``research/``)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TypeAlias, TypedDict

import torch

from benchmarks.rows import AnyRow
from seqae_core.device import native_bf16_flags
from seqae_errors import ConfigError
from sweeps.running.progress import text_table


@dataclass(frozen=True)
class Options:
    """``seqae bench``'s options, checked: each suite reads those it takes."""

    shapes: str  # throughput: input:latent lengths, comma-separated
    steps: int  # throughput: timed steps per measurement
    workspace: str | None  # data-scale: where its corpus stays
    data: str
    sizes: str  # control-plane: the sweeps' sizes, comma-separated
    optuna: str  # control-plane: the Optuna storages, comma-separated
    before: str | None  # control-plane: a checkout of seqae from before its fixes
    command: str | None  # processes: the command whose CPU-seconds it counts
    pages: int  # data-scale: the synthetic corpus's pages
    interrupt: float | None  # data-scale: the fraction of the pages to kill the preparation at


class Machine(TypedDict):
    """The machine the benchmarks ran on, the head of their JSON file."""

    cpu: str
    cores: int
    gpu: str | None
    torch: str
    python: str


Suite: TypeAlias = Callable[[Options], Sequence[AnyRow]]
# The JSON file: the machine, the start, and each suite's rows by its name.
Results: TypeAlias = dict[str, Machine | str | Sequence[AnyRow]]


def _module(name: str) -> ModuleType:
    """A benchmark module, imported when its suite runs (the GPU one needs no data, for example)."""
    return importlib.import_module(f"benchmarks.{name}")


def _throughput(options: Options) -> Sequence[AnyRow]:
    throughput = _module("throughput")
    shapes = [tuple(int(n) for n in s.split(":")) for s in options.shapes.split(",")]
    precisions = ["bf16"] if torch.cuda.is_available() else ["fp32"] + (["bf16"] if native_bf16_flags() else [])
    rows = throughput.run(options.data, shapes, ["paper", "transformer"], precisions, options.steps)
    return [*rows, *([] if torch.cuda.is_available() else throughput.quickstart_paths(options.data))]


def _on_a_gpu(suite: Suite) -> Suite:
    """A suite that measures GPUs: one row saying so where there is none."""

    def guarded(options: Options) -> Sequence[AnyRow]:
        return suite(options) if torch.cuda.is_available() else [{"status": "skipped: no GPU on this machine"}]

    return guarded


SUITES: dict[str, Suite] = {
    "throughput": _throughput,
    "overhead": lambda o: _module("sweep_overhead").run(o.data),
    "data": lambda o: (
        _module("data_prep").prefix_vs_whole(o.data)
        + _module("data_prep").cache_hit(o.data)
        + _module("data_prep").parallel(o.data)
    ),
    "data-scale": lambda o: _module("data_scale").run(
        o.data, o.pages, o.interrupt, Path(o.workspace) if o.workspace else None
    ),
    "gpu": _on_a_gpu(lambda o: _module("gpu_packing").run(o.data)),
    "step": lambda o: _module("step_check").suite(),
    "fuse": lambda o: _module("fuse").run(),
    "scale": lambda o: _module("scale").run(o.data),
    "processes": lambda o: _module("process_cpu").run(o.command),
    "control-plane": lambda o: _module("control_plane").run(
        [int(n) for n in o.sizes.split(",")], o.optuna.split(","), Path(o.before) if o.before else None
    ),
}


def machine() -> Machine:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def table(rows: Sequence[AnyRow]) -> str:
    if not rows:
        return "(no rows)"
    columns = list(dict.fromkeys(c for row in rows for c in row))
    return text_table(columns, [[str(r.get(c, "")) for c in columns] for r in rows])


def main(names: list[str], out: Path, options: Options) -> Results:
    results: Results = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"machine: {results['machine']}")
    for name in names:
        start = time.perf_counter()
        rows = SUITES[name](options)
        results[name] = rows
        print(f"\n== {name} ({time.perf_counter() - start:.0f} s)\n{table(rows)}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out}")
    return results


def command(args: argparse.Namespace) -> Results:
    """``seqae bench``'s arguments checked, each mistake refused in one line before anything runs;
    then :func:`main`."""
    if not args.suites:  # every suite together takes hours: a user names what to measure
        raise ConfigError(f"name the benchmark suites to run (seqae bench SUITE ...): {', '.join(SUITES)}")
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        raise ConfigError(f"unknown benchmark suite {unknown[0]!r}; choose from {', '.join(SUITES)}")
    if args.before and not any(
        (Path(args.before) / cli).is_file() for cli in ("seqae/__main__.py", "seqae_cli/main.py")
    ):
        raise ConfigError(f"--before {args.before!r} is not a checkout of seqae (no seqae/__main__.py there)")
    if "processes" in args.suites and not args.command:
        raise ConfigError(
            "bench processes needs --command CMD: the command whose CPU-seconds it counts (for example .ci/run)"
        )
    data = args.data or os.environ.get("SEQAE_BENCH_DATA") or "wikimedia/wikipedia"
    if "data-scale" in args.suites and not Path(data).expanduser().is_dir():
        raise ConfigError(
            f"bench data-scale cuts its pages from a local folder in the wikimedia/wikipedia layout; "
            f"--data {data!r} is not one (for example --data ../shared/data/wikipedia-mini)"
        )
    if args.pages < 2:
        raise ConfigError(f"--pages {args.pages} is too few: a split needs at least 2 pages")
    if args.interrupt is not None and not 0 < args.interrupt < 1:
        raise ConfigError(f"--interrupt {args.interrupt} is not a fraction of the pages between 0 and 1")
    return main(
        args.suites,
        Path(args.out),
        Options(
            shapes=args.shapes,
            steps=args.steps,
            workspace=args.workspace,
            data=data,
            sizes=args.sizes,
            optuna=args.optuna,
            before=args.before,
            command=args.command,
            pages=args.pages,
            interrupt=args.interrupt,
        ),
    )
