"""The paper's data at its size: ``pages`` synthetic pages with Wikipedia's page lengths, cut from
the offline corpus, through the real preparation (the tokenizer, the first 512 tokens of each
page, the cache entry a sweep's trials read), in a fresh process: its wall time, pages/s,
CPU-seconds, peak memory and bytes on disk; and, with ``interrupt``, the same preparation killed
(SIGKILL) part way and run again, which resumes and must write the same entry."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TypedDict, overload

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.corpora import NAME
from benchmarks.rows import AnyRow

PAPER_PAGES = 1_900_000  # the first 30% of English Wikipedia (the paper)
# Page lengths in words, drawn log-normal with English Wikipedia's mean (about 4.5 billion words
# in 6.7 million articles: Wikipedia:Size of Wikipedia, 2023) and an assumed median of half of it
# (most articles are short, a few very long); the offline pages are long ones (median 2,273 words).
WORDS_MEAN, WORDS_MEDIAN = 670, 335
SHARD = 50_000  # pages per parquet file
# Pages per parquet row group: datasets streams a parquet file a row group at a time, so the row
# group, not the file, sets the reader's memory (1,000 rows: the batch datasets itself writes).
ROW_GROUP = 1_000
INPUT_LEN = 512
WORKERS = 2  # tokenizing processes unless SEQAE_DATA_WORKERS says: one per core of this machine


class Corpus(TypedDict):
    """The synthetic corpus's figures, its row of the data-scale table (kept beside its pages)."""

    pages: int
    mean_words: int
    median_words: int
    parquet_bytes: int


class Prepared(TypedDict):
    """A preparation's figures, its row of the data-scale table (all but ``files``)."""

    pages: int
    seconds: float
    pages_per_s: float
    cpu_seconds: float
    peak_rss_mib: int
    peak_pss_mib: int
    entry_bytes: int
    peak_disk_bytes: int
    resumed_after_pages: int
    files: dict[str, dict[str, int | str]]  # the entry's files by name, as its manifest lists them


class Killed(TypedDict):
    """A preparation killed part way: when, and how many pages it had recorded."""

    killed_after_s: float
    pages_recorded: int | None


def synthetic(source: Path, folder: Path, pages: int, seed: int = 0) -> Corpus:
    """Write ``pages`` pages in the layout of ``wikimedia/wikipedia`` into ``folder``: each a run
    of whole words of the offline corpus from a random place, as long as a length drawn from
    Wikipedia's distribution. Kept when ``folder`` already holds them (a rerun reuses them)."""
    described, layout = folder / "pages.json", [pages, SHARD, ROW_GROUP]
    if described.exists() and (kept := json.loads(described.read_text())).pop("layout", None) == layout:
        return kept
    shutil.rmtree(folder, ignore_errors=True)
    texts = pq.read_table(next((source / NAME).glob("*.parquet")), columns=["text"]).column("text").to_pylist()
    text = "\n\n".join(texts)
    chars_per_word = len(text) / len(text.split())
    rng = np.random.default_rng(seed)
    sigma = math.sqrt(2 * math.log(WORDS_MEAN / WORDS_MEDIAN))  # a log-normal's mean is its median x e^(sigma^2/2)
    words = rng.lognormal(math.log(WORDS_MEDIAN), sigma, pages)
    chars = np.clip((words * chars_per_word).astype(np.int64), 8, len(text) // 2)
    starts = rng.integers(0, len(text) - chars)
    (folder / NAME).mkdir(parents=True)
    shards = math.ceil(pages / SHARD)
    for shard in range(shards):
        rows = range(shard * SHARD, min(pages, (shard + 1) * SHARD))
        body = []
        for i in rows:
            start = text.find(" ", starts[i]) + 1  # from a word's start
            body.append(text[start : start + chars[i]])
        table = pa.table(
            {
                "id": [str(i) for i in rows],
                "url": [f"synthetic:{i}" for i in rows],
                "title": [f"page {i}" for i in rows],
                "text": body,
            }
        )
        pq.write_table(
            table,
            folder / NAME / f"train-{shard:05d}-of-{shards:05d}.parquet",
            compression="zstd",
            row_group_size=ROW_GROUP,
        )
    (folder / "README.md").write_text(
        f"---\nconfigs:\n- config_name: {NAME}\n  data_files:\n  - split: train\n"
        f"    path: {NAME}/train-*\n---\n# {pages} synthetic pages cut from {source}\n"
    )
    made: Corpus = {
        "pages": pages,
        "mean_words": round(float(words.mean())),
        "median_words": round(float(np.median(words))),
        "parquet_bytes": _bytes(folder / NAME),
    }
    described.write_text(json.dumps({**made, "layout": layout}))
    return made


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


PREPARE = """
import json, resource, sys, time
from pathlib import Path
from seqae_core import data
from seqae_core.config import DataConfig
started = time.perf_counter()
entry = data.prepare(DataConfig(path=sys.argv[1], samples="first", input_len={input_len}), Path(sys.argv[2]))
seconds = time.perf_counter() - started
usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(json.dumps({{"entry": str(entry), "seconds": seconds,
                  "cpu_seconds": sum(u.ru_utime + u.ru_stime for u in usage)}}))
"""


class Watch:
    """Polls a process and its children twice a second: the peak of their summed resident memory
    (RSS: pages shared between them counted in each, an upper bound) and of their proportional
    memory (PSS: shared pages divided among them), and the peak bytes under a folder."""

    def __init__(self, pid: int, folder: Path) -> None:
        self.process, self.folder = psutil.Process(pid), folder
        self.rss = self.pss = self.disk = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.wait(0.5):
            rss = pss = 0
            try:
                for process in [self.process, *self.process.children(recursive=True)]:
                    memory = process.memory_full_info()
                    rss, pss = rss + memory.rss, pss + memory.pss
            except psutil.Error:  # a process ended between the listing and the reading
                continue
            self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)
            self.disk = max(self.disk, _bytes(self.folder))

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def workers() -> int:
    return int(os.environ.get("SEQAE_DATA_WORKERS", WORKERS))


@overload
def _prepare(corpus: Path, cache: Path, kill_at: None = None) -> Prepared: ...
@overload
def _prepare(corpus: Path, cache: Path, kill_at: int) -> Killed: ...
def _prepare(corpus: Path, cache: Path, kill_at: int | None = None) -> Prepared | Killed:
    """One preparation in a fresh process with :func:`workers` tokenizing processes, watched;
    with ``kill_at``, SIGKILLed (it and its workers) once its progress records that many pages."""
    cache.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", PREPARE.format(input_len=INPUT_LEN), str(corpus), str(cache)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "SEQAE_DATA_WORKERS": str(workers())},
    )
    watch = Watch(child.pid, cache)
    recorded = None
    while kill_at is not None and child.poll() is None:
        recorded = next(
            (json.loads(p.read_text())["source_pages"] for p in cache.glob(".building-*/partial/progress.json")), 0
        )
        if recorded >= kill_at:
            os.killpg(child.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    out, _ = child.communicate()
    watch.stop()
    wall = time.perf_counter() - started
    if kill_at is not None:
        if child.returncode != -signal.SIGKILL:
            raise RuntimeError(f"the preparation ended ({child.returncode}) before it recorded {kill_at} pages")
        return {"killed_after_s": round(wall, 1), "pages_recorded": recorded}
    if child.returncode != 0:
        raise RuntimeError(f"the preparation exited with {child.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    entry = Path(result["entry"])
    manifest = json.loads((entry / "manifest.json").read_text())
    tokenized = manifest["pages"] - manifest["resumed_after_pages"]  # a resumed run: only those after the resume point
    return {
        "pages": manifest["pages"],
        "seconds": round(result["seconds"], 1),
        "pages_per_s": round(tokenized / result["seconds"], 1),
        "cpu_seconds": round(result["cpu_seconds"], 1),
        "peak_rss_mib": round(watch.rss / 2**20),
        "peak_pss_mib": round(watch.pss / 2**20),
        "entry_bytes": _bytes(entry),
        "peak_disk_bytes": watch.disk,
        "resumed_after_pages": manifest["resumed_after_pages"],
        "files": manifest["files"],
    }


def run(
    source: str, pages: int = PAPER_PAGES, interrupt: float | None = None, workspace: Path | None = None
) -> list[AnyRow]:
    """The rows of ``seqae bench data-scale``: the synthetic corpus, the preparation, and with
    ``interrupt`` the preparation killed at that fraction of the pages and run again."""
    with tempfile.TemporaryDirectory() as temporary:
        folder = workspace or Path(temporary)
        made = synthetic(Path(source), folder / f"corpus-{pages}", pages)
        rows: list[AnyRow] = [{"case": "synthetic corpus", **made}]
        shutil.rmtree(folder / "cache", ignore_errors=True)
        whole = _prepare(folder / f"corpus-{pages}", folder / "cache" / "whole")
        rows.append(
            {
                "case": f"prepare, {workers()} worker{'s' * (workers() > 1)}, first {INPUT_LEN} tokens",
                **{k: v for k, v in whole.items() if k != "files"},
            }
        )
        if interrupt is not None:
            killed = _prepare(folder / f"corpus-{pages}", folder / "cache" / "resumed", kill_at=int(interrupt * pages))
            rows.append({"case": f"killed at {interrupt:.0%} of the pages", **killed})
            resumed = _prepare(folder / f"corpus-{pages}", folder / "cache" / "resumed")
            rows.append(
                {
                    "case": "run again: resumed",
                    **{k: v for k, v in resumed.items() if k != "files"},
                    "same_entry_as_uninterrupted": resumed["files"] == whole["files"],
                }
            )
        shutil.rmtree(folder / "cache", ignore_errors=True)
        return rows
