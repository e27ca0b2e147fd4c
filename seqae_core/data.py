"""Text dataset -> fixed-length token samples, cached on disk and split by page.

Any Hugging Face dataset with a text column loads through ``datasets.load_dataset(path, name)``
(default ``wikimedia/wikipedia``, ``20231101.en``); a local folder in the same layout loads
through the same call. Pages are streamed, so ``data.max_pages`` reads only what it needs.

``data.samples``:
  first    the first ``input_len`` tokens of each page, one sample per page, short pages padded
           (the paper). Only a prefix of each page is tokenized.
  windows  consecutive non-overlapping ``input_len``-token windows of each page; the last one padded.

``data.vocab``:
  tokenizer  token ids are the tokenizer's (BERT: 30,522), the paper's recipe.
  corpus     ids are renumbered over the tokens that occur in the prepared pages (and the pad
             token), so the vocabulary head scores only those: the 60 quickstart pages use about
             12,000 of BERT's ids, which makes a training step about 2.5x cheaper on a CPU.
             ``token_ids.npy`` maps each corpus id back to the tokenizer's id.

The tokenized samples are cached under ``cache_dir/<key>/``, keyed by everything that changes
them. An entry is built in a temporary folder and renamed into place, and a manifest holds the
size and SHA-256 of each file, so a partial or corrupted entry is detected and rebuilt. The test
and validation splits are drawn by page afterwards, so trials with other split settings share an
entry: first the test pages (``data.test_fraction``, from their own seed), then the validation
pages among the rest.

On a cluster, the driver prepares an entry once and :func:`publish` es it where every node reaches
(a shared folder, or an object store); :func:`prepare` given that ``published`` location fetches
it once per node into the node's own cache (under the same lock, checksums verified), and never
tokenizes or reads the source. ``fetched.json`` in the entry says from where, how many bytes, how long.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import os
import shutil
import socket
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

import datasets
import numpy as np
import pyarrow.fs as pafs
import torch
from filelock import FileLock
from huggingface_hub import constants
from transformers import AutoTokenizer

from seqae_core.config import DataConfig
from seqae_core.storage import filesystem
from seqae_errors import ConfigError

log = logging.getLogger(__name__)

FORMAT = 2  # bump when the layout of an entry changes
FILES = ("tokens.npy", "pages.npy", "vocab.json", "token_ids.npy")
PAGE_BATCH = 512  # pages per tokenizer call
# Drawn after tokenizing: entries do not depend on them.
SPLIT_SETTINGS = ("val_fraction", "split_seed", "test_fraction", "test_seed")
CHARS_PER_TOKEN = 5.0  # characters tokenized per token still needed; English averages about 4.5


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


def cache_key(config: DataConfig) -> dict[str, Any]:
    """Everything that changes the tokenized samples. The split settings are not in it."""
    key = asdict(config)
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


def entry_name(key: dict[str, Any]) -> str:
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


def describe(entry: Path, config: DataConfig) -> dict[str, Any]:
    """What a run of ``config`` trains on, for its tracking: a digest of the entry's contents (the
    checksums its manifest holds, not hashed again) and of the split settings, so that runs on
    different data, or on other splits of the same entry, are told apart; and the size of each split."""
    manifest = json.loads((entry / "manifest.json").read_text())
    contents = {"files": {name: f["sha256"] for name, f in manifest["files"].items()},
                **{name: getattr(config, name) for name in SPLIT_SETTINGS}}
    splits = open_splits(entry, config)
    return {"digest": hashlib.sha256(json.dumps(contents, sort_keys=True).encode()).hexdigest()[:10],
            "entry": entry.name, "pages": manifest["pages"],
            "samples": {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)}}


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
        building = cache_dir / f".building-{name}-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir()
        try:
            if key is not None:
                build(config, key, building)
            else:
                fetch(str(published), building)
                problem = check_entry(building, key)
                if problem is not None:
                    raise RuntimeError(f"the data entry published at {published} is unusable: {problem}")
            os.replace(building, entry)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return entry


def check_entry(entry: Path, key: dict[str, Any] | None) -> str | None:
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
    (out / "fetched.json").write_text(json.dumps({
        "from": uri, "bytes": moved, "seconds": round(time.perf_counter() - started, 3),
        "host": socket.gethostname(), "pid": os.getpid()}))
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


@functools.cache
def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face Hub cannot be reached (None if it can, or if HF_HUB_OFFLINE is set):
    one TCP connection to its endpoint, so that an offline machine hears it at once instead of
    after the Hub client's retries (five per file, with backoff: about a minute)."""

    if constants.HF_HUB_OFFLINE:
        return None
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=timeout).close()
    except OSError as exc:
        return f"the Hugging Face Hub ({constants.ENDPOINT}) is unreachable: {one_line(exc)}"
    return None


def load_tokenizer(name: str) -> Any:
    unreachable = hub_unreachable()
    try:  # with the Hub unreachable, a tokenizer in the hub cache still loads
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=unreachable is not None)
    except OSError as exc:
        raise ConfigError(f"data.tokenizer={name!r} cannot be loaded: {unreachable or one_line(exc).rstrip('.')}. "
                          "Offline? Point HF_HUB_CACHE at a hub cache that holds it and set HF_HUB_OFFLINE=1") from None
    tokenizer.model_max_length = 1 << 30  # pages are long on purpose; silence the length warning
    return tokenizer


def iter_texts(config: DataConfig) -> Iterator[str]:
    """Page texts in dataset order, at most ``data.max_pages`` of them."""
    args = (config.path,) if config.name is None else (config.path, config.name)
    # Streaming opens the source lazily: an unreachable Hub or a missing file can surface at the
    # first page as well as at load_dataset, so both sit inside the same guard.
    unloadable = (OSError, ValueError, datasets.exceptions.DatasetNotFoundError)  # ConnectionError is an OSError
    if not Path(config.path).expanduser().exists() and (unreachable := hub_unreachable()):
        raise ConfigError(cannot_load(config, ConnectionError(unreachable)))
    try:
        pages = iter(datasets.load_dataset(*args, split=config.split, streaming=True))
        first = next(pages, None)
    except unloadable as exc:
        raise ConfigError(cannot_load(config, exc)) from None
    for i, page in enumerate(pages if first is None else itertools.chain([first], pages)):
        if config.max_pages is not None and i >= config.max_pages:
            return
        if config.text_column not in page:
            raise ConfigError(
                f"data.text_column={config.text_column!r} is not a column of {config.path}; "
                f"columns: {', '.join(page)}"
            )
        yield page[config.text_column]


def one_line(exc: BaseException) -> str:
    """An exception's text folded onto one line of at most 300 characters."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def cannot_load(config: DataConfig, exc: BaseException) -> str:
    """One line naming data.path, why it did not load, and what to do."""
    reason = one_line(exc)
    local = Path(config.path).expanduser()
    if local.is_absolute() or config.path.startswith((".", "~")) or local.exists():
        hint = ("set data.path to a folder in the wikimedia/wikipedia layout (e.g. "
                "--set data.path=../shared/data/wikipedia-mini)")
        where = "is not a loadable dataset folder" if local.exists() else f"does not exist ({local.resolve()})"
        return f"data.path={config.path!r} {where}: {reason}; {hint}"
    return (f"data.path={config.path!r} (data.name={config.name!r}) cannot be loaded from the Hugging Face Hub: "
            f"{reason.rstrip('.')}. Offline? Set data.path to a local folder in the wikimedia/wikipedia layout (e.g. "
            "--set data.path=../shared/data/wikipedia-mini), or go online")


def check_source(config: DataConfig) -> None:
    """Raise :class:`ConfigError`, naming the key, unless the tokenizer loads and the dataset
    yields a first page with the text column. Cheap: one page is read, nothing is written."""
    load_tokenizer(config.tokenizer)
    if next(iter_texts(config), None) is None:
        raise ConfigError(f"data.path={config.path!r} has no pages in split {config.split!r}")


def _batches(texts: Iterator[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def prefix_at_whitespace(text: str, chars: int) -> tuple[str, bool]:
    """The longest prefix of at most ``chars`` characters that ends before whitespace, and
    whether it is shorter than ``text``. BERT-style tokenizers split words at whitespace, so the
    tokens of such a prefix are exactly the first tokens of the whole text."""
    if len(text) <= chars:
        return text, False
    cut = chars
    while cut > 0 and not text[cut].isspace():
        cut -= 1
    return text[:cut], True  # empty if no whitespace: the caller retries with a longer prefix


def first_tokens(tokenizer: Any, texts: list[str], n: int) -> list[list[int]]:
    """The first ``n`` token ids of each text, tokenizing only about as much text as they need.

    Each round tokenizes, from where the last one stopped, a piece cut at whitespace and sized
    for the tokens still missing; pieces cut at whitespace tokenize to exactly the tokens the
    whole text has there, so the result equals ``tokenizer(text)[:n]``."""
    result: list[list[int]] = [[] for _ in texts]
    start = [0] * len(texts)
    pending = list(range(len(texts)))
    while pending:
        pieces = []
        for i in pending:
            budget = int((n - len(result[i])) * CHARS_PER_TOKEN) + 32
            # budget + 1 characters are enough to know whether more text follows the piece
            piece, truncated = prefix_at_whitespace(texts[i][start[i] : start[i] + budget + 1], budget)
            while truncated and not piece:  # one word longer than the budget
                budget *= 4
                piece, truncated = prefix_at_whitespace(texts[i][start[i] : start[i] + budget + 1], budget)
            pieces.append((i, piece, truncated))
        ids = tokenizer([piece for _, piece, _ in pieces], add_special_tokens=False)["input_ids"]
        retry = []
        for (i, piece, truncated), tokens in zip(pieces, ids):
            result[i].extend(tokens)
            start[i] += len(piece)
            if len(result[i]) >= n or not truncated:
                result[i] = result[i][:n]
            else:
                retry.append(i)
        pending = retry
    return result


def window_tokens(tokenizer: Any, texts: list[str], n: int) -> list[list[list[int]]]:
    """Each text's tokens cut into consecutive ``n``-token windows (the last may be shorter)."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [[tokens[i : i + n] for i in range(0, len(tokens), n)] for tokens in ids]


def build(config: DataConfig, key: dict[str, Any], out: Path, workers: int | None = None) -> None:
    """Tokenize the dataset into ``out``: tokens.npy (n, t), pages.npy (n,), vocab.json, manifest.json.

    Pages stream in batches of ``PAGE_BATCH``; ``workers`` processes (default: ``SEQAE_DATA_WORKERS``,
    else 1, this process) tokenize batches in parallel, in order, a few batches ahead at most.
    Each batch's rows are appended to a file on disk as they come, so memory stays bounded by a
    few batches whatever the number of pages; ``tokens.npy`` is then written from that file in
    blocks (renumbered on the way for ``data.vocab: corpus``)."""
    start = time.perf_counter()
    tokenizer = load_tokenizer(config.tokenizer)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ConfigError(f"data.tokenizer={config.tokenizer!r} has no pad token")
    vocab_size = len(tokenizer)
    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    seen = np.zeros(vocab_size, dtype=bool)  # which ids occur (data.vocab: corpus)
    seen[pad_id] = True
    n_rows = n_pages = 0
    workers = workers or int(os.environ.get("SEQAE_DATA_WORKERS", "1"))
    with open(out / "tokens.raw", "wb") as raw_tokens, open(out / "pages.raw", "wb") as raw_pages:
        for rows, page_of_row in _tokenized(config, tokenizer, workers, pad_id, dtype):
            seen[rows] = True
            raw_tokens.write(rows.tobytes())
            raw_pages.write((page_of_row + n_pages).astype(np.int64).tobytes())
            n_rows += len(rows)
            n_pages += int(page_of_row[-1]) + 1 if len(page_of_row) else 0
    if n_pages < 2:
        raise ConfigError(f"data.path={config.path!r} gave {n_pages} non-empty pages; at least 2 are needed")
    token_ids = np.arange(vocab_size, dtype=np.int64)  # (v,) tokenizer id of each id in tokens.npy
    renumber = None
    if config.vocab == "corpus":
        token_ids = np.flatnonzero(seen).astype(np.int64)  # sorted: an id's rank among them is its new id
        renumber = (np.cumsum(seen) - 1).astype(dtype)
        pad_id, vocab_size = int(renumber[pad_id]), len(token_ids)
    raw = np.memmap(out / "tokens.raw", dtype=dtype, mode="r", shape=(n_rows, config.input_len))
    tokens = np.lib.format.open_memmap(out / "tokens.npy", mode="w+", dtype=dtype, shape=raw.shape)
    for i in range(0, n_rows, 1 << 16):  # blocks of 65,536 rows: 64 MiB at N=512
        tokens[i : i + (1 << 16)] = raw[i : i + (1 << 16)] if renumber is None else renumber[raw[i : i + (1 << 16)]]
    tokens.flush()
    del tokens, raw
    (out / "tokens.raw").unlink()
    np.save(out / "pages.npy", np.fromfile(out / "pages.raw", dtype=np.int64))
    (out / "pages.raw").unlink()
    np.save(out / "token_ids.npy", token_ids)
    vocab = tokenizer.convert_ids_to_tokens(token_ids.tolist())
    (out / "vocab.json").write_text(json.dumps(vocab))
    manifest = {
        "format": FORMAT,
        "key": key,
        "pad_id": pad_id,
        "vocab_size": vocab_size,
        "samples": n_rows,
        "pages": n_pages,
        "seconds": round(time.perf_counter() - start, 3),
        "workers": workers,
        "built_by": {"host": socket.gethostname(), "pid": os.getpid()},
        "files": {name: {"bytes": (out / name).stat().st_size, "sha256": sha256(out / name)} for name in FILES},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    log.info("tokenized %d pages into %d samples in %.1fs", n_pages, n_rows, manifest["seconds"])


def _tokenized(config: DataConfig, tokenizer: Any, workers: int, pad_id: int,
               dtype: Any) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(rows, page of each row within the batch)`` per batch of pages, in dataset order."""
    batches = _batches(iter_texts(config), PAGE_BATCH)
    settings = (config.samples, config.input_len, pad_id, np.dtype(dtype).str)
    if workers <= 1:
        for texts in batches:
            yield _rows(tokenizer, texts, *settings)
        return

    with ProcessPoolExecutor(workers, initializer=_load_worker_tokenizer, initargs=(config.tokenizer,)) as pool:
        ahead: collections.deque = collections.deque()
        for texts in batches:
            ahead.append(pool.submit(_rows_in_worker, texts, *settings))
            if len(ahead) >= 2 * workers:  # bounded: a few batches in flight
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


_WORKER_TOKENIZER: Any = None


def _load_worker_tokenizer(name: str) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = load_tokenizer(name)


def _rows_in_worker(texts: list[str], *settings: Any) -> tuple[np.ndarray, np.ndarray]:
    return _rows(_WORKER_TOKENIZER, texts, *settings)


def _rows(tokenizer: Any, texts: list[str], samples: str, n: int, pad_id: int,
          dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """One batch of pages as padded rows, and the page (0, 1, ... within the batch, empty pages
    skipped) each row belongs to."""
    if samples == "first":
        per_page = [[t] if t else [] for t in first_tokens(tokenizer, texts, n)]
    else:
        per_page = window_tokens(tokenizer, texts, n)
    per_page = [windows for windows in per_page if windows]  # an empty page gives no sample
    return pad_rows(per_page, n, pad_id, dtype)


def pad_rows(per_text: list[list[list[int]]], n: int, pad_id: int,
             dtype: Any = np.int64) -> tuple[np.ndarray, np.ndarray]:
    """Each text's windows of at most ``n`` ids as rows of ``n`` ids, short ones padded with
    ``pad_id``: ``(rows (r, n), the index in per_text of each row's text (r,))``. A text without
    windows has no row."""
    rows = np.full((sum(len(w) for w in per_text), n), pad_id, dtype=np.dtype(dtype))
    texts = np.repeat(np.arange(len(per_text), dtype=np.int64), [len(w) for w in per_text])
    for i, window in enumerate(window for windows in per_text for window in windows):
        rows[i, : len(window)] = window
    return rows, texts


def decode(vocab: list[str], ids: list[int], pad_id: int) -> list[str]:
    """Token strings of ``ids``, stopping at padding."""
    return [vocab[i] for i in itertools.takewhile(lambda i: i != pad_id, ids)]


def detokenize(tokens: list[str]) -> str:
    """WordPiece tokens back to readable text: ``##`` pieces join the token before them."""
    text = ""
    for token in tokens:
        text += token[2:] if token.startswith("##") else (" " + token if text else token)
    return text
