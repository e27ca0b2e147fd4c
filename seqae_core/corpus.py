"""A text dataset's pages, tokenized: the source a cache entry of :mod:`seqae_core.data` is built from.

Any Hugging Face dataset with a text column loads through ``datasets.load_dataset(path, name)``;
a local folder in the same layout loads through the same call. Pages are streamed, so
``data.max_pages`` reads only what it needs. Kept apart from :mod:`seqae_core.data` because
its libraries (transformers, datasets) are a third of a trial worker's imports, and a trial reads
the entry its driver built: they load only where an entry is built, a source checked, or text
encoded."""

from __future__ import annotations

import collections
import functools
import io
import itertools
import json
import shutil
import socket
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import urlparse

import datasets
import numpy as np
from huggingface_hub import constants
from transformers import AutoTokenizer

from seqae_core.config import DataConfig
from seqae_core.storage import write_atomically
from seqae_errors import ConfigError, one_line

PAGE_BATCH = 512  # pages per tokenizer call
PARTIAL = "partial"  # the folder of a build's progress, inside the entry it builds
CHARS_PER_TOKEN = 5.0  # characters tokenized per token still needed; English averages about 4.5


@dataclass(frozen=True)
class Tokenized:
    """What :func:`tokenize` wrote, for the entry's manifest."""

    pad_id: int  # in the entry's ids (renumbered for data.vocab: corpus)
    vocab_size: int
    samples: int
    pages: int
    resumed_after: int = 0  # source pages an earlier, killed build of the entry had tokenized


class Progress(TypedDict):
    """How far a build got (``partial/progress.json``, :func:`tokenize`)."""

    key: Mapping[str, object]  # the entry's (seqae_core.data.cache_key), which it only keeps and compares
    source_pages: int  # read from the dataset
    pages: int  # of them non-empty, with rows on disk
    rows: int
    written: dict[str, int] | None  # once the entry's files are: Tokenized's fields but resumed_after


@functools.cache
def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face Hub cannot be reached (None if it can, or if HF_HUB_OFFLINE is set):
    one TCP connection to its endpoint, so that an offline machine hears it at once instead of
    after the Hub client's retries (five per file, with backoff: about a minute)."""

    if constants.HF_HUB_OFFLINE:
        return None
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection(
            (url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout
        ).close()
    except OSError as exc:
        return f"the Hugging Face Hub ({constants.ENDPOINT}) is unreachable: {one_line(exc)}"
    return None


def load_tokenizer(name: str) -> Any:
    unreachable = hub_unreachable()
    try:  # with the Hub unreachable, a tokenizer in the hub cache still loads
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=unreachable is not None)
    except OSError as exc:
        raise ConfigError(
            f"data.tokenizer={name!r} cannot be loaded: {unreachable or one_line(exc).rstrip('.')}. "
            "Offline? Point HF_HUB_CACHE at a hub cache that holds it and set HF_HUB_OFFLINE=1"
        ) from None
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
                f"data.text_column={config.text_column!r} is not a column of {config.path}; columns: {', '.join(page)}"
            )
        yield page[config.text_column]


def cannot_load(config: DataConfig, exc: BaseException) -> str:
    """One line naming data.path, why it did not load, and what to do."""
    reason = one_line(exc)
    local = Path(config.path).expanduser()
    if local.is_absolute() or config.path.startswith((".", "~")) or local.exists():
        hint = (
            "set data.path to a folder in the wikimedia/wikipedia layout (e.g. "
            "--set data.path=../shared/data/wikipedia-mini)"
        )
        where = "is not a loadable dataset folder" if local.exists() else f"does not exist ({local.resolve()})"
        return f"data.path={config.path!r} {where}: {reason}; {hint}"
    return (
        f"data.path={config.path!r} (data.name={config.name!r}) cannot be loaded from the Hugging Face Hub: "
        f"{reason.rstrip('.')}. Offline? Set data.path to a local folder in the wikimedia/wikipedia layout (e.g. "
        "--set data.path=../shared/data/wikipedia-mini), or go online"
    )


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


def tokenize(config: DataConfig, out: Path, key: Mapping[str, object], workers: int = 1) -> Tokenized:
    """Tokenize the dataset into ``out``: tokens.npy (n, t), pages.npy (n,), token_ids.npy (v,),
    vocab.json. The caller writes the manifest that makes them an entry (seqae_core.data.build),
    then removes ``out/partial`` (:func:`finish`).

    Pages stream in batches of ``PAGE_BATCH``; ``workers`` processes (1: this process) tokenize
    batches in parallel, in order, a few batches ahead at most. Each batch's rows are appended to a
    file on disk as they come, so memory stays bounded by a few batches whatever the number of
    pages; ``tokens.npy`` is then written from that file in blocks (renumbered on the way for
    ``data.vocab: corpus``), by plain reads and writes, so that no mapping of the whole file counts
    in the process's memory.

    Resumable: after each batch, ``out/partial/progress.json`` records how many source pages and
    rows are on disk, beside ``seen.npy`` (which ids occur). Called again on the same ``out`` with
    the same ``key`` after being killed, it truncates the rows of the batch it never recorded and
    goes on after the last recorded one, so only the batches in flight are tokenized twice and the
    entry is byte for byte the uninterrupted one's. Anything else in ``out`` is cleared first."""
    partial = out / PARTIAL
    progress = _resume_point(partial, key)
    if progress is None:
        for path in out.iterdir():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        partial.mkdir()
        progress = Progress(key=key, source_pages=0, pages=0, rows=0, written=None)
    resumed_after = int(progress["source_pages"])
    if progress["written"] is not None:  # killed after the entry's files were written: nothing is left to do
        return Tokenized(**progress["written"], resumed_after=resumed_after)
    tokenizer = load_tokenizer(config.tokenizer)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ConfigError(f"data.tokenizer={config.tokenizer!r} has no pad token")
    vocab_size = len(tokenizer)
    dtype = np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)
    seen = np.load(partial / "seen.npy") if (partial / "seen.npy").exists() else np.zeros(vocab_size, dtype=bool)
    seen[pad_id] = True  # which ids occur (data.vocab: corpus)
    with open(partial / "tokens.raw", "ab") as raw_tokens, open(partial / "pages.raw", "ab") as raw_pages:
        raw_tokens.truncate(progress["rows"] * config.input_len * dtype.itemsize)  # a batch never recorded
        raw_pages.truncate(progress["rows"] * np.dtype(np.int64).itemsize)
        for read, rows, page_of_row in _tokenized(config, tokenizer, workers, pad_id, dtype, progress["source_pages"]):
            seen[rows] = True
            raw_tokens.write(rows.tobytes())
            raw_pages.write((page_of_row + progress["pages"]).astype(np.int64).tobytes())
            raw_tokens.flush()
            raw_pages.flush()
            progress["source_pages"] += read
            progress["rows"] += len(rows)
            progress["pages"] += int(page_of_row[-1]) + 1 if len(page_of_row) else 0
            # seen first: killed between the two, the batch is redone and adds the same ids again
            write_atomically(partial / "seen.npy", _npy(seen))
            write_atomically(partial / "progress.json", json.dumps(progress).encode())
    n_rows, n_pages = int(progress["rows"]), int(progress["pages"])
    if n_pages < 2:
        raise ConfigError(f"data.path={config.path!r} gave {n_pages} non-empty pages; at least 2 are needed")
    token_ids = np.arange(vocab_size, dtype=np.int64)  # (v,) tokenizer id of each id in tokens.npy
    renumber = None
    if config.vocab == "corpus":
        token_ids = np.flatnonzero(seen).astype(np.int64)  # sorted: an id's rank among them is its new id
        renumber = (np.cumsum(seen) - 1).astype(dtype)
        pad_id, vocab_size = int(renumber[pad_id]), len(token_ids)
    _write_rows(partial / "tokens.raw", out / "tokens.npy", (n_rows, config.input_len), dtype, renumber)
    np.save(out / "pages.npy", np.fromfile(partial / "pages.raw", dtype=np.int64))
    np.save(out / "token_ids.npy", token_ids)
    vocab = tokenizer.convert_ids_to_tokens(token_ids.tolist())
    (out / "vocab.json").write_text(json.dumps(vocab))
    made = Tokenized(pad_id=int(pad_id), vocab_size=vocab_size, samples=n_rows, pages=n_pages)
    progress["written"] = {k: v for k, v in asdict(made).items() if k != "resumed_after"}
    write_atomically(partial / "progress.json", json.dumps(progress).encode())
    return replace(made, resumed_after=resumed_after)


def finish(out: Path) -> None:
    """Remove a build's progress from ``out`` once its manifest makes it an entry."""
    shutil.rmtree(out / PARTIAL, ignore_errors=True)


def _resume_point(partial: Path, key: Mapping[str, object]) -> Progress | None:
    """The progress recorded in ``partial`` by a build of ``key`` that stopped, else None."""
    try:
        progress = json.loads((partial / "progress.json").read_text())
    except (OSError, ValueError):
        return None
    return progress if progress.get("key") == key else None


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _write_rows(raw: Path, target: Path, shape: tuple[int, int], dtype: np.dtype, renumber: np.ndarray | None) -> None:
    """The rows in ``raw`` as the ``.npy`` file ``target``, 65,536 rows (64 MiB at N=512) at a
    time, renumbered on the way when ``renumber`` is given."""
    block = (1 << 16) * shape[1]
    with open(raw, "rb") as source, open(target, "wb") as sink:
        np.lib.format.write_array_header_1_0(
            sink, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
        )
        while (ids := np.fromfile(source, dtype=dtype, count=block)).size:
            sink.write((ids if renumber is None else renumber[ids]).tobytes())


def _tokenized(
    config: DataConfig, tokenizer: Any, workers: int, pad_id: int, dtype: Any, skip: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """``(source pages read, rows, page of each row within the batch)`` per batch of pages, in
    dataset order, after the first ``skip`` source pages."""
    batches = _batches(itertools.islice(iter_texts(config), skip, None), PAGE_BATCH)
    settings = (config.samples, config.input_len, pad_id, np.dtype(dtype).str)
    if workers <= 1:
        for texts in batches:
            yield len(texts), *_rows(tokenizer, texts, *settings)
        return

    with ProcessPoolExecutor(workers, initializer=_load_worker_tokenizer, initargs=(config.tokenizer,)) as pool:
        ahead: collections.deque = collections.deque()
        for texts in batches:
            ahead.append((len(texts), pool.submit(_rows_in_worker, texts, *settings)))
            if len(ahead) >= 2 * workers:  # bounded: a few batches in flight
                read, rows = ahead.popleft()
                yield read, *rows.result()
        while ahead:
            read, rows = ahead.popleft()
            yield read, *rows.result()


_WORKER_TOKENIZER: Any = None


def _load_worker_tokenizer(name: str) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = load_tokenizer(name)


def _rows_in_worker(texts: list[str], *settings: Any) -> tuple[np.ndarray, np.ndarray]:
    return _rows(_WORKER_TOKENIZER, texts, *settings)


def _rows(
    tokenizer: Any, texts: list[str], samples: str, n: int, pad_id: int, dtype: str
) -> tuple[np.ndarray, np.ndarray]:
    """One batch of pages as padded rows, and the page (0, 1, ... within the batch, empty pages
    skipped) each row belongs to."""
    if samples == "first":
        per_page = [[t] if t else [] for t in first_tokens(tokenizer, texts, n)]
    else:
        per_page = window_tokens(tokenizer, texts, n)
    per_page = [windows for windows in per_page if windows]  # an empty page gives no sample
    return pad_rows(per_page, n, pad_id, dtype)


def pad_rows(
    per_text: list[list[list[int]]], n: int, pad_id: int, dtype: Any = np.int64
) -> tuple[np.ndarray, np.ndarray]:
    """Each text's windows of at most ``n`` ids as rows of ``n`` ids, short ones padded with
    ``pad_id``: ``(rows (r, n), the index in per_text of each row's text (r,))``. A text without
    windows has no row."""
    rows = np.full((sum(len(w) for w in per_text), n), pad_id, dtype=np.dtype(dtype))
    texts = np.repeat(np.arange(len(per_text), dtype=np.int64), [len(w) for w in per_text])
    for i, window in enumerate(window for windows in per_text for window in windows):
        rows[i, : len(window)] = window
    return rows, texts
