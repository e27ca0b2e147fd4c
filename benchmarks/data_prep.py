"""Data preparation: tokenizing only each page's first N tokens against tokenizing whole pages;
the start-up of a later trial that finds the tokenized data in the cache; and preparation in one
or two processes on a larger input (the paper's 1.9 M pages: :mod:`benchmarks.data_scale`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import numpy as np

from benchmarks.corpora import repeated
from seqae_core import corpus
from seqae_core.config import DataConfig


class Band(TypedDict):
    """A row of the prefix-versus-whole table: a page-length band's tokenizing seconds each way."""

    pages: str
    count: int
    mean_tokens: int
    whole_s: float
    prefix_s: float
    speedup: float


class _Load(TypedDict):
    case: str
    load_s: float
    samples: int


class Load(_Load, total=False):
    """A row of the cache table: a fresh process loading data, its cache entry missing or there."""

    import_s: float
    entries: int


class Preparation(TypedDict):
    """A row of the parallel table: preparing the samples with some workers on some cores."""

    workers: int
    cores: int
    pages: int
    seconds: float
    pages_per_s: float
    peak_rss_mib: float


def _best(fn: Callable[..., object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def prefix_vs_whole(path: str, n: int = 512) -> list[Band]:
    """Per page-length band and overall: the whole-page baseline is ``tokenizer(pages)[:n]``."""
    tokenizer = corpus.load_tokenizer("bert-base-uncased")
    pages = list(corpus.iter_texts(DataConfig(path=path)))
    lengths = np.array([len(t) for t in tokenizer(pages, add_special_tokens=False)["input_ids"]])
    assert corpus.first_tokens(tokenizer, pages, n) == [
        t[:n] for t in tokenizer(pages, add_special_tokens=False)["input_ids"]
    ], "prefix tokenization must be exact"
    bands = [("all pages", np.ones(len(pages), bool))]
    edges = np.quantile(lengths, [0, 0.5, 1.0])
    bands += [(f"{int(lo)}-{int(hi)} tokens", (lengths >= lo) & (lengths <= hi)) for lo, hi in zip(edges, edges[1:])]
    rows: list[Band] = []
    for label, mask in bands:
        chosen = [p for p, keep in zip(pages, mask) if keep]
        whole = _best(lambda chosen=chosen: tokenizer(chosen, add_special_tokens=False, truncation=True, max_length=n))
        prefix = _best(lambda chosen=chosen: corpus.first_tokens(tokenizer, chosen, n))
        rows.append(
            {
                "pages": label,
                "count": len(chosen),
                "mean_tokens": int(lengths[mask].mean()),
                "whole_s": round(whole, 4),
                "prefix_s": round(prefix, 4),
                "speedup": round(whole / prefix, 1),
            }
        )
    return rows


def cache_hit(path: str) -> list[Load]:
    """A fresh process (as a trial is) loading data whose cache entry exists."""
    config = {"path": path, "samples": "windows", "input_len": 512, "max_pages": 200}
    with tempfile.TemporaryDirectory() as cache:
        script = (
            "import time, json; t0 = time.perf_counter(); from seqae_core import data; "
            "from seqae_core.config import DataConfig; t1 = time.perf_counter(); "
            f"s = data.load(DataConfig(**{config!r}), {cache!r}); t2 = time.perf_counter(); "
            "print(json.dumps([t1 - t0, t2 - t1, int(s.tokens.shape[0])]))"
        )
        build = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        hit = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        entries = [p for p in Path(cache).iterdir() if p.is_dir()]
    _, miss_s, samples = json.loads(build.stdout.strip().splitlines()[-1])
    import_s, hit_s, _ = json.loads(hit.stdout.strip().splitlines()[-1])
    return [
        {"case": "cache miss (tokenize and write)", "load_s": round(miss_s, 3), "samples": samples},
        {
            "case": "cache hit (later trial)",
            "load_s": round(hit_s, 3),
            "samples": samples,
            "import_s": round(import_s, 3),
            "entries": len(entries),
        },
    ]


def parallel(path: str, copies: int = 82, n: int = 512) -> list[Preparation]:
    """Pages/s and peak memory preparing the paper's samples (``first``, N tokens) from ``path``'s
    pages repeated ``copies`` times, with 1 worker on 1 core, 1 on 2 cores (only the tokenizer's
    own threads use the second) and 2 workers on 2 cores, each in a fresh process."""
    rows: list[Preparation] = []
    with tempfile.TemporaryDirectory() as tmp:
        big = repeated(Path(path), Path(tmp) / "big", copies)
        runs = ((1, "0"), (1, "0,1"), (2, "0,1"))  # the 2nd: only the tokenizer's own threads use core 1
        for run_index, (workers, cores) in enumerate(runs):
            script = (
                "import json, resource, time; from pathlib import Path; from seqae_core import data; "
                "from seqae_core.config import DataConfig; t = time.perf_counter(); "
                f"e = data.prepare(DataConfig(path={str(big)!r}, samples='first', input_len={n}), "
                f"Path({tmp!r}) / 'cache-{run_index}'); s = time.perf_counter() - t; "
                "m = json.loads((e / 'manifest.json').read_text()); "
                "print(json.dumps([s, m['pages'], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
                "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))"
            )
            run = subprocess.run(
                ["taskset", "-c", cores, sys.executable, "-c", script],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "SEQAE_DATA_WORKERS": str(workers)},
            )
            seconds, pages, rss, child_rss = json.loads(run.stdout.strip().splitlines()[-1])
            rows.append(
                {
                    "workers": workers,
                    "cores": len(cores.split(",")),
                    "pages": pages,
                    "seconds": round(seconds, 2),
                    "pages_per_s": round(pages / seconds, 1),
                    # the main process, plus each worker at the largest worker's peak (an upper bound)
                    "peak_rss_mib": round((rss + (workers * child_rss if workers > 1 else 0)) / 1024, 1),
                }
            )
    return rows
