"""Text dataset -> fixed-length token samples, cached on disk and split by page.

The pages and their tokenizer are :mod:`seqae_core.corpus`'s: this module keeps the cache of
tokenized entries, and loads the tokenizer's libraries only to build one.

``data.samples``:
  first    the first ``input_len`` tokens of each page, one sample per page, short pages padded
           (the paper). Only a prefix of each page is tokenized.
  windows  consecutive non-overlapping ``input_len``-token windows of each page; the last one padded.

``data.vocab``:
  tokenizer  token ids are the tokenizer's (BERT: 30,522), the paper's recipe.
  corpus     ids are renumbered over the tokens that occur in the prepared pages (and the pad
             token), so the vocabulary head scores only those: a few pages use a fraction of
             BERT's ids, and the head's cost on a CPU falls with it (measured:
             docs/explanation/performance.md, "The figures behind the code's choices").
             ``token_ids.npy`` maps each corpus id back to the tokenizer's id.

The tokenized samples are cached under ``cache_dir/<key>/``, keyed by everything that changes
them. An entry is built in a folder of its own and renamed into place, and a manifest holds the
size and SHA-256 of each file, so a partial or corrupted entry is detected and rebuilt. A build
killed midway (a worker lost, Ctrl-C, SIGKILL) leaves that folder, and the next build of the
same entry resumes it after its last recorded batch (:func:`seqae_core.corpus.tokenize`). The test
and validation splits are drawn by page afterwards, so trials with other split settings share an
entry: first the test pages (``data.test_fraction``, from their own seed), then the validation
pages among the rest.

On a cluster, the driver prepares an entry once and :func:`publish` es it where every node reaches
(a shared folder, or an object store); :func:`prepare` given that ``published`` location fetches
it once per node into the node's own cache (under the same lock, checksums verified), and never
tokenizes or reads the source. ``fetched.json`` in the entry says from where, how many bytes, how long.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TypedDict

import numpy as np
import pyarrow.fs as pafs
import torch
from filelock import FileLock

from seqae_core.config import DataConfig, FlatValue
from seqae_core.storage import filesystem
from seqae_errors import ConfigError, one_line

log = logging.getLogger(__name__)

FORMAT = 2  # bump when the layout of an entry changes
FILES = ("tokens.npy", "pages.npy", "vocab.json", "token_ids.npy")
# Drawn after tokenizing: entries do not depend on them.
SPLIT_SETTINGS = ("val_fraction", "split_seed", "test_fraction", "test_seed")

# What an entry is made of (:func:`cache_key`): the data config's fields but the split settings,
# ``format``, and for a local folder each file's ``[path, bytes, mtime_ns]``.
CacheKey = dict[str, FlatValue | list[list[str | int]]]


class Facts(TypedDict):
    """What a run trains on, for its tracking (:func:`describe`)."""

    digest: str  # of the entry's contents and the split settings
    entry: str  # the entry's folder name
    pages: int
    samples: dict[str, int]  # by split: train, val, test


def default_cache_dir() -> Path:
    return Path(os.environ.get("SEQAE_CACHE_DIR", Path.home() / ".cache" / "seqae" / "data"))


@dataclass(frozen=True)
class Splits:
    """All samples (memory-mapped, shared by every process that opens the entry) and the rows
    of each split."""

    tokens: np.ndarray  # (n, t) token ids
    train: np.ndarray  # (n_train,) row indices
    val: np.ndarray  # (n_val,) row indices
    test: np.ndarray  # (n_test,) row indices; empty without a test split
    pad_id: int
    vocab_size: int
    entry: Path
    token_ids: np.ndarray  # (vocab_size,) the tokenizer's id of each id in ``tokens``

    def batch(self, rows: np.ndarray) -> torch.Tensor:
        """Rows of ``tokens`` as a (b, t) int64 tensor."""
        return torch.from_numpy(self.tokens[np.sort(rows)].astype(np.int64))

    def vocab(self) -> list[str]:
        """Token strings by id, for showing reconstructions without loading the tokenizer."""
        return json.loads((self.entry / "vocab.json").read_text())


def cache_key(config: DataConfig) -> CacheKey:
    """Everything that changes the tokenized samples. The split settings are not in it."""
    key: CacheKey = asdict(config)
    for split_only in SPLIT_SETTINGS:
        key.pop(split_only)
    local = Path(config.path).expanduser()
    if local.exists():
        root = local.resolve()
        key["path"] = str(root)
        files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
        key["files"] = [[str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    key["format"] = FORMAT
    return key


def entry_name(key: CacheKey) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def load(config: DataConfig, cache_dir: Path | None = None, published: str | None = None) -> Splits:
    """Prepare (or reuse, or fetch) the cache entry for ``config`` and split it by page."""
    return open_splits(prepare(config, cache_dir, published), config)


def open_splits(entry: Path, config: DataConfig) -> Splits:
    """The samples of the valid entry ``entry``, memory-mapped, split by page as ``config`` says."""
    manifest = json.loads((entry / "manifest.json").read_text())
    tokens = np.load(entry / "tokens.npy", mmap_mode="r")
    pages = np.load(entry / "pages.npy", mmap_mode="r")
    n_pages = manifest["pages"]
    is_test = held_out_pages(n_pages, config)
    rest = np.flatnonzero(~is_test)
    n_val = max(1, round(config.val_fraction * n_pages))
    if n_val >= len(rest):
        raise ConfigError(
            f"data.val_fraction={config.val_fraction} and data.test_fraction={config.test_fraction} leave no "
            f"training pages out of {n_pages}; raise data.max_pages or lower the fractions"
        )
    is_val = np.zeros(n_pages, dtype=bool)
    is_val[rest[np.random.default_rng(config.split_seed).permutation(len(rest))[:n_val]]] = True
    return Splits(
        token_ids=np.load(entry / "token_ids.npy"),
        tokens=tokens,
        train=np.flatnonzero(~(is_val | is_test)[pages]),
        val=np.flatnonzero(is_val[pages]),
        test=np.flatnonzero(is_test[pages]),
        pad_id=manifest["pad_id"],
        vocab_size=manifest["vocab_size"],
        entry=entry,
    )


def held_out_pages(n_pages: int, config: DataConfig) -> np.ndarray:
    """Which of the first ``n_pages`` pages are test pages: page i is when the i-th number drawn
    from ``test_seed`` falls below ``test_fraction``, so a page's membership depends on nothing
    else (a larger ``max_pages`` only adds pages); at least one page when the fraction is above 0."""
    draws = np.random.default_rng(config.test_seed).random(n_pages)
    is_test = draws < config.test_fraction
    if config.test_fraction > 0 and not is_test.any():
        is_test[np.argmin(draws)] = True
    return is_test


def describe(entry: Path, config: DataConfig) -> Facts:
    """What a run of ``config`` trains on, for its tracking: a digest of the entry's contents (the
    checksums its manifest holds, not hashed again) and of the split settings, so that runs on
    different data, or on other splits of the same entry, are told apart; and the size of each split."""
    manifest = json.loads((entry / "manifest.json").read_text())
    contents = {
        "files": {name: f["sha256"] for name, f in manifest["files"].items()},
        **{name: getattr(config, name) for name in SPLIT_SETTINGS},
    }
    splits = open_splits(entry, config)
    return {
        "digest": hashlib.sha256(json.dumps(contents, sort_keys=True).encode()).hexdigest()[:10],
        "entry": entry.name,
        "pages": manifest["pages"],
        "samples": {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)},
    }


def prepare(config: DataConfig, cache_dir: Path | None = None, published: str | None = None) -> Path:
    """The path of a valid cache entry for ``config``, building it if needed; or, given the URI of
    the entry a driver published for ``config`` (:func:`publish`), fetching it: the entry keeps
    the driver's name and key, since this node may not see the source the key describes.

    Concurrent callers (the trials of a sweep on one node) wait on a lock instead of tokenizing
    or fetching twice."""
    cache_dir = Path(cache_dir or default_cache_dir())
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = cache_key(config) if published is None else None
    name = entry_name(key) if key is not None else str(published).rstrip("/").rsplit("/", 1)[-1]
    entry = cache_dir / name
    with FileLock(str(cache_dir / f"{name}.lock")):
        problem = check_entry(entry, key)
        if problem is None:
            return entry
        if entry.exists():
            log.warning("data cache %s is unusable (%s); rebuilding it", entry, problem)
            shutil.rmtree(entry)
        # One name per entry, not per process: under the lock, a build killed midway is found by the
        # next caller, who resumes it (seqae_core.corpus.tokenize); a fetch starts over.
        building = cache_dir / f".building-{name}"
        if key is None:
            shutil.rmtree(building, ignore_errors=True)
        building.mkdir(exist_ok=True)
        try:
            if key is not None:
                build(config, key, building)
            else:
                fetch(str(published), building)
                problem = check_entry(building, key)
                if problem is not None:
                    raise RuntimeError(f"the data entry published at {published} is unusable: {problem}")
        except BaseException as exc:  # kept to resume unless a fetch, or settings that would fail the same way again
            if key is None or isinstance(exc, ConfigError):
                shutil.rmtree(building, ignore_errors=True)
            raise
        os.replace(building, entry)
    return entry


def build(config: DataConfig, key: CacheKey, out: Path, workers: int | None = None) -> None:
    """Tokenize the dataset into ``out`` (:func:`seqae_core.corpus.tokenize`, ``workers`` processes:
    default ``SEQAE_DATA_WORKERS``, else 1) and write the manifest that makes it an entry: ``key``,
    and each file's size and SHA-256."""
    # Imported here, the one place outside the command line: transformers and datasets are a large
    # share of a trial's worker's imports (measured: docs/explanation/performance.md, "The figures
    # behind the code's choices"), and a trial reads the entry its driver built.
    from seqae_core import corpus

    start = time.perf_counter()
    workers = workers or int(os.environ.get("SEQAE_DATA_WORKERS", "1"))
    made = corpus.tokenize(config, out, key, workers)
    manifest = {
        "format": FORMAT,
        "key": key,
        "pad_id": made.pad_id,
        "vocab_size": made.vocab_size,
        "samples": made.samples,
        "pages": made.pages,
        "seconds": round(time.perf_counter() - start, 3),
        "workers": workers,
        "resumed_after_pages": made.resumed_after,
        "built_by": {"host": socket.gethostname(), "pid": os.getpid()},
        "files": {name: {"bytes": (out / name).stat().st_size, "sha256": sha256(out / name)} for name in FILES},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    corpus.finish(out)
    log.info("tokenized %d pages into %d samples in %.1fs", made.pages, made.samples, manifest["seconds"])


def check_entry(entry: Path, key: CacheKey | None) -> str | None:
    """None if ``entry`` is complete and intact (and made for ``key``, if given), else what is wrong
    with it."""
    if not entry.exists():
        return "missing"
    try:
        manifest = json.loads((entry / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        return f"no readable manifest ({exc})"
    if key is not None and manifest.get("key") != key:
        return "manifest is for other settings"
    for name in FILES:
        expected = manifest.get("files", {}).get(name)
        path = entry / name
        if expected is None or not path.exists():
            return f"{name} is missing"
        if path.stat().st_size != expected["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, expected {expected['bytes']}"
        if sha256(path) != expected["sha256"]:
            return f"{name} does not match its checksum"
    return None


def shared_settings(config: DataConfig) -> DataConfig:
    """``config`` with its split settings at their defaults: the configs that share one entry."""
    return replace(config, **{name: getattr(DataConfig, name) for name in SPLIT_SETTINGS})


def publish(entry: Path, uri: str) -> int:
    """Copy a valid entry to ``uri/<entry name>``, its manifest last, so that a reader never sees a
    partial one; an entry published whole already stays. Returns the bytes copied."""
    fs, root = filesystem(uri)
    target = f"{root}/{entry.name}"
    manifest = (entry / "manifest.json").read_bytes()
    with contextlib.suppress(FileNotFoundError, OSError):
        with fs.open_input_stream(f"{target}/manifest.json") as f:
            if f.read() == manifest:
                return 0
    fs.create_dir(target)
    _copy_files(pafs.LocalFileSystem(), str(entry), fs, target)
    with fs.open_output_stream(f"{target}/manifest.json") as f:
        f.write(manifest)
    return _entry_bytes(entry, manifest)


def fetch(uri: str, out: Path) -> None:
    """Copy the entry published at ``uri`` into the empty folder ``out``, and say so in
    ``out/fetched.json``; the caller checks it against its manifest."""
    fs, root = filesystem(uri)
    started = time.perf_counter()
    try:
        with fs.open_input_stream(f"{root}/manifest.json") as f:
            manifest = f.read()
    except (FileNotFoundError, OSError) as exc:
        raise RuntimeError(f"no data entry is published at {uri} ({one_line(exc)})") from exc
    _copy_files(fs, root, pafs.LocalFileSystem(), str(out))
    (out / "manifest.json").write_bytes(manifest)
    moved = _entry_bytes(out, manifest)
    (out / "fetched.json").write_text(
        json.dumps(
            {
                "from": uri,
                "bytes": moved,
                "seconds": round(time.perf_counter() - started, 3),
                "host": socket.gethostname(),
                "pid": os.getpid(),
            }
        )
    )
    log.info("fetched data entry %s (%d bytes)", uri, moved)


def _copy_files(source_fs: pafs.FileSystem, source: str, target_fs: pafs.FileSystem, target: str) -> None:
    """An entry's data files (not its manifest) from one folder to another, across filesystems."""
    for name in FILES:
        pafs.copy_files(f"{source}/{name}", f"{target}/{name}", source_fs, target_fs)


def _entry_bytes(folder: Path, manifest: bytes) -> int:
    return sum((folder / name).stat().st_size for name in FILES) + len(manifest)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def decode(vocab: list[str], ids: list[int], pad_id: int) -> list[str]:
    """Token strings of ``ids``, stopping at padding."""
    return [vocab[i] for i in itertools.takewhile(lambda i: i != pad_id, ids)]


def detokenize(tokens: list[str]) -> str:
    """WordPiece tokens back to readable text: ``##`` pieces join the token before them."""
    text = ""
    for token in tokens:
        text += token[2:] if token.startswith("##") else (" " + token if text else token)
    return text
