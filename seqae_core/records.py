"""A training run's records (a sweep trial's, or ``seqae train --checkpoint-dir``'s) in a local
folder or an object store (through pyarrow's filesystems). This module is the one place that
knows where a trial's records live, their file names and what their manifests hold; it reads
and writes bytes, so that what only reads a sweep (``seqae sweep status``, the ledger, export)
imports no PyTorch. What the bytes of a training checkpoint are is ``seqae_core.checkpoint``'s.

A store holds records, each a folder of files plus a ``manifest.json`` written last with the
size and SHA-256 of every file, and the record's :class:`TrialProgress` (epoch records) or metrics
(best records):

    epoch-000003/state.pt      everything needed to continue exactly (see ``seqae_core.train``)
    best-000002/model.pt       the best model so far: its config, weights and token ids
    best-000002/samples.*      sample reconstructions (JSON, and text with wrong tokens marked)
    best-000002/metrics.json   the metrics of that epoch
    failed.txt                 why the run cannot succeed, if it failed in a way that repeats
    left.txt                   the pack it left, if a scheduler stopped it while the pack went on
    lease.json                 on an object store: which writer holds the store now

A record whose manifest is missing, or whose files do not match it, is never loaded: the
store falls back to the newest valid record and says which one it skipped and why.

A run that ended outside the ones a sweep keeps is *released* (:meth:`RecordStore.release`): its
newest epoch record keeps its manifest (the run's progress) without ``state.pt``, its best record
keeps the samples and metrics without ``model.pt``, and the older epoch records go. It can no
longer train on; everything that reads how it went reads it as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

import pyarrow.fs as pafs
from filelock import FileLock

from seqae_core import metrics as M
from seqae_core.config import Flat
from seqae_core.epoch import Scores
from seqae_core.storage import filesystem

log = logging.getLogger(__name__)

STATE, MODEL, SAMPLES_JSON, SAMPLES_TXT, METRICS = "state.pt", "model.pt", "samples.json", "samples.txt", "metrics.json"

LEASE = "lease.json"  # an object store's writer lease (see ``RecordStore.exclusive``)
LEFT = "left.txt"  # the pack a run left (``RecordStore.record_leave``)
STOP_NOW = "stop-now.txt"  # who asked the run to stop at once (``RecordStore.record_stop``)

S = TypeVar("S", bound="RecordStore")  # of_trial builds the store of the class it is called on

_RECORD = re.compile(r"^(epoch|best)-(\d{6})$")


class FileEntry(TypedDict):  # a manifest's line for one of its record's files
    bytes: int
    sha256: str


class RecordMeta(TypedDict, total=False):
    """What a record's manifest says of its run besides its files: an epoch record's progress
    (``history``, ``finished``, ``patience_spent``), a best record's ``metrics`` and ``config``;
    ``released`` once :meth:`RecordStore.release` dropped its checkpoint."""

    epoch: int  # the result's number, which names the record
    history: list[dict[str, Any]]  # every result's metrics (EpochRecord.as_dict), which readers take as numbers
    finished: bool
    patience_spent: bool
    metrics: Scores
    config: Flat
    released: bool


class Manifest(TypedDict):  # a record's manifest.json, written last
    files: dict[str, FileEntry]
    meta: RecordMeta


class LeaseLost(RuntimeError):
    """A newer writer (the trial resumed elsewhere) took the store's lease: this one must stop."""


@dataclass
class Loaded:
    """The newest valid record of a kind, and what was skipped to find it."""

    epoch: int | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    meta: RecordMeta = field(default_factory=lambda: RecordMeta())
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TrialProgress:
    """What the newest epoch record says of its run, read from the manifest alone."""

    epoch: float  # epochs trained: a fraction where its newest record is a validation between epochs' ends
    history: list[dict[str, Any]]  # every result's metrics so far (an epoch's each, by default)
    finished: bool  # trained to its last epoch or stopped early: nothing left to run
    patience_spent: bool = False  # stopped early: more epochs would not train it on
    released: bool = False  # its checkpoints are gone (RecordStore.release): it cannot train on

    def done(self, epochs: int | None = None) -> bool:
        """Nothing left to run; with ``epochs``, a limit raised since (``seqae sweep extend``), also
        that it reached that limit or its patience ran out."""
        return self.finished and (epochs is None or self.epoch >= epochs or self.patience_spent)


class RecordStore:
    """Epoch and best-model records of one training run under ``uri``."""

    def __init__(self, uri: str, keep: int = 2, located: tuple[pafs.FileSystem, str] | None = None) -> None:
        """``located``: ``uri``'s filesystem and path, when the caller has them (:meth:`progress_of`)."""
        self.uri = uri
        self.fs, self.root = located or filesystem(uri)
        self.keep = keep
        self.lease: str | None = None  # this writer's lease on an object store (see ``exclusive``)

    @classmethod
    def of_trial(cls: type[S], storage: str, number: int) -> S:
        """The records of trial ``number`` of a sweep that keeps its checkpoints in ``storage``."""
        return cls(f"{storage.rstrip('/')}/trials/{number:04d}")

    @classmethod
    def progress_of(cls, storage: str, numbers: Iterable[int]) -> dict[int, TrialProgress | None]:
        """:meth:`progress` of each trial of ``numbers``, their folder located once: reading 10,000
        trials' progress (a sweep's cost in `seqae sweep status`) took twice as long resolving
        each trial's path on its own."""
        uri = f"{storage.rstrip('/')}/trials"
        fs, root = filesystem(uri)
        return {n: cls(f"{uri}/{n:04d}", located=(fs, f"{root}/{n:04d}")).progress() for n in numbers}

    @staticmethod
    def trials(storage: str) -> list[int]:
        """The numbers of the trials that have a store in ``storage``, in order."""
        fs, root = filesystem(f"{storage.rstrip('/')}/trials")
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            return []
        return sorted(
            int(info.base_name)
            for info in fs.get_file_info(pafs.FileSelector(root))
            if info.type == pafs.FileType.Directory and info.base_name.isdigit()
        )

    # -- what the sweep reads ------------------------------------------------------------------
    def progress(self) -> TrialProgress | None:
        """How far the run got, without loading a checkpoint; None before its first epoch."""
        meta = self.newest_meta("epoch")
        if meta is None:
            return None
        history = list(meta.get("history", []))
        # the record is named by its result number (train.validate_every); its history says the epochs trained
        trained = history[-1][M.EPOCH] if history else int(meta["epoch"])
        return TrialProgress(
            trained, history, bool(meta.get("finished")), bool(meta.get("patience_spent")), bool(meta.get("released"))
        )

    def best_epoch(self) -> int | None:
        """The epoch of the newest best-model record, without reading its files."""
        meta = self.newest_meta("best")
        return None if meta is None else int(meta["epoch"])

    def save_best(self, epoch: int, files: dict[str, bytes], meta: RecordMeta) -> None:
        self._write(f"best-{epoch:06d}", files, {"epoch": epoch, **meta})
        self._prune("best", 1)

    def latest(self, kind: str = "epoch", only: tuple[str, ...] | None = None) -> Loaded:
        """The newest record of ``kind`` whose files match their manifest; ``only``: of its files,
        just these (a reader that needs no model neither reads one nor minds its release)."""
        loaded = Loaded()
        for epoch in sorted(self._epochs(kind), reverse=True):
            name = f"{kind}-{epoch:06d}"
            problem, files, meta = self._read(name, only)
            if problem is None:
                loaded.epoch, loaded.files, loaded.meta = epoch, files, meta
                break
            loaded.skipped.append(f"{name}: {problem}")
        for note in loaded.skipped:
            log.warning("checkpoint %s/%s skipped", self.uri, note)
        return loaded

    @contextlib.contextmanager
    def exclusive(self, timeout: float = 120.0) -> Iterator[None]:
        """Hold the store alone. On a local or shared path, wait for an older writer to exit
        first (a worker that outlived its driver, say); the kernel releases the lock when its
        holder dies. An object store has no such lock: this writer takes the store's lease
        (``lease.json``) instead, and an older writer, which checks the lease before each record,
        stops with :class:`LeaseLost` rather than write beside it."""
        if not isinstance(self.fs, pafs.LocalFileSystem):
            self.lease = uuid.uuid4().hex
            self.fs.create_dir(self.root, recursive=True)
            with self.fs.open_output_stream(f"{self.root}/{LEASE}") as out:
                out.write(
                    json.dumps(
                        {"holder": self.lease, "host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
                    ).encode()
                )
            try:
                yield
            finally:
                self.lease = None
            return

        self.fs.create_dir(self.root, recursive=True)
        with FileLock(self.writer_lock, timeout=timeout):  # raises Timeout, a TimeoutError
            yield

    @property
    def writer_lock(self) -> str:
        """The lock a local store's writer holds (:meth:`exclusive`)."""
        return f"{self.root}/.writer.lock"

    def release(self) -> int:
        """Drop what only training on needs (see the module's docstring); returns the bytes freed.
        Of each kind, the newest record with a readable manifest stays, that manifest replaced
        before its dropped file goes, so that a crash leaves the record whole or released, never
        a manifest naming a missing file; every other record of the kind goes."""
        freed = 0
        for kind, dropped in (("epoch", STATE), ("best", MODEL)):
            kept = False
            for epoch in sorted(self._epochs(kind), reverse=True):
                folder = f"{self.root}/{kind}-{epoch:06d}"
                manifest = None if kept else self._manifest(folder)
                if manifest is not None:
                    kept = True
                    freed += self._strip(folder, manifest, dropped)
                else:
                    freed += self._size(folder)
                    self.fs.delete_dir(folder)
        return freed

    def _manifest(self, folder: str) -> Manifest | None:
        """The record's manifest, or None where it is missing or unreadable."""
        try:
            with self.fs.open_input_stream(f"{folder}/manifest.json") as f:
                manifest = json.loads(f.read())
        except (OSError, ValueError):
            return None
        valid = isinstance(manifest, dict) and all(isinstance(manifest.get(k), dict) for k in ("files", "meta"))
        return manifest if valid else None

    def _strip(self, folder: str, manifest: Manifest, dropped: str) -> int:
        entry = manifest["files"].pop(dropped, None)
        size = 0 if entry is None else int(entry.get("bytes", 0))
        manifest["meta"]["released"] = True
        self._put_manifest(folder, manifest)
        if self.fs.get_file_info(f"{folder}/{dropped}").type != pafs.FileType.NotFound:
            self.fs.delete_file(f"{folder}/{dropped}")
        return size

    def _size(self, folder: str) -> int:
        return sum(info.size or 0 for info in self.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)))

    def records(self, kind: str = "epoch") -> list[str]:
        """The paths of the records of ``kind`` (``epoch`` or ``best``), oldest first, valid or not."""
        return [f"{self.root}/{kind}-{epoch:06d}" for epoch in sorted(self._epochs(kind))]

    def newest_meta(self, kind: str = "epoch") -> RecordMeta | None:
        """The metadata of the newest record of ``kind`` with a readable manifest, without
        reading its files: enough to know a run's metric history and whether it finished."""
        for epoch in sorted(self._epochs(kind), reverse=True):
            manifest = self._manifest(f"{self.root}/{kind}-{epoch:06d}")
            if manifest is not None:
                return manifest["meta"].copy()
        return None

    def record_verdict(self, error: str) -> None:
        """Mark the run as failed for a reason that would repeat if it were run again."""
        self._check_lease()
        with self.fs.open_output_stream(f"{self.root}/failed.txt") as out:
            out.write(error.encode())

    def verdict(self) -> str | None:
        """The recorded reason this run cannot succeed, if any."""
        try:
            with self.fs.open_input_stream(f"{self.root}/failed.txt") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return None

    def clear_verdict(self) -> None:
        """Forget the recorded failure (:meth:`record_verdict`): its cause was fixed, the run is tried again."""
        if self.verdict() is not None:
            self.fs.delete_file(f"{self.root}/failed.txt")

    def start_over(self) -> None:
        """Drop every record: the run is trained again from its first epoch."""
        if self.fs.get_file_info(self.root).type != pafs.FileType.NotFound:
            self.fs.delete_dir_contents(self.root)

    def record_stop(self, by: str) -> None:
        """Ask the run's worker to stop before its next step (`seqae sweep stop --trial --now`): it
        polls for this (:meth:`stop_asked`), as for its node going away."""
        with self.fs.open_output_stream(f"{self.root}/{STOP_NOW}") as out:
            out.write(by.encode())

    def stop_asked(self) -> bool:
        return self.fs.get_file_info(f"{self.root}/{STOP_NOW}").type != pafs.FileType.NotFound

    def clear_stop(self) -> None:
        """Forget :meth:`record_stop` once the run stopped: a later continuation trains on."""
        if self.stop_asked():
            self.fs.delete_file(f"{self.root}/{STOP_NOW}")

    def record_leave(self, pack: str) -> None:
        """Mark the run as leaving the pack of runs that trains it (``pack``: the pack's name), at the
        end of the epoch its last record holds: one whom a scheduler stopped while the others go on.
        A retry of that pack leaves it out; a later pack (a continued sweep's) trains it again."""
        with self.fs.open_output_stream(f"{self.root}/{LEFT}") as out:
            out.write(pack.encode())

    def left(self, pack: str) -> bool:
        """Whether the run left the pack named ``pack`` (:meth:`record_leave`)."""
        try:
            with self.fs.open_input_stream(f"{self.root}/{LEFT}") as f:
                return bool(f.read().decode(errors="replace") == pack)
        except FileNotFoundError:
            return False

    def _epochs(self, kind: str) -> list[int]:
        found = []
        for info in self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True)):
            match = _RECORD.match(info.base_name)
            if match and match.group(1) == kind:
                found.append(int(match.group(2)))
        return found

    def _check_lease(self) -> None:
        """Raise :class:`LeaseLost` if a newer writer took this object store's lease. (Between this
        check and the record's manifest, a few seconds, a stale writer can still finish the one
        record it had begun; the newer writer's records of the same epochs replace it.)"""
        if self.lease is None:
            return
        try:
            with self.fs.open_input_stream(f"{self.root}/{LEASE}") as f:
                holder = json.loads(f.read())
        except (OSError, ValueError) as exc:
            raise LeaseLost(f"{self.uri}: the lease is gone ({exc})") from exc
        if holder.get("holder") != self.lease:
            raise LeaseLost(
                f"{self.uri}: a newer writer ({holder.get('host')}, pid {holder.get('pid')}) took the "
                "lease; this one stops without writing"
            )

    def _write(self, name: str, files: dict[str, bytes], meta: RecordMeta) -> None:
        self._check_lease()
        folder = f"{self.root}/{name}"
        self.fs.create_dir(folder, recursive=True)
        self.fs.delete_dir_contents(folder)  # a record rewritten after a resume starts empty
        listing: dict[str, FileEntry] = {}
        for file_name, data in files.items():
            with self.fs.open_output_stream(f"{folder}/{file_name}") as out:
                out.write(data)
            listing[file_name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        # The manifest goes last, so it only exists once the files do.
        self._put_manifest(folder, {"files": listing, "meta": meta})

    def _put_manifest(self, folder: str, manifest: Manifest) -> None:
        """Write the record's manifest through a temporary name, so a crash leaves the old one or
        the new one whole, never half of one."""
        with self.fs.open_output_stream(f"{folder}/manifest.json.tmp") as out:
            out.write(json.dumps(manifest, indent=1).encode())
        self.fs.move(f"{folder}/manifest.json.tmp", f"{folder}/manifest.json")

    def _read(self, name: str, only: tuple[str, ...] | None = None) -> tuple[str | None, dict[str, bytes], RecordMeta]:
        folder = f"{self.root}/{name}"
        try:
            with self.fs.open_input_stream(f"{folder}/manifest.json") as f:
                manifest = json.loads(f.read())
            files = {}
            for file_name, expected in manifest["files"].items():
                if only is not None and file_name not in only:
                    continue
                with self.fs.open_input_stream(f"{folder}/{file_name}") as f:
                    data = f.read()
                if len(data) != expected["bytes"]:
                    return f"{file_name} has {len(data)} bytes, expected {expected['bytes']}", {}, RecordMeta()
                if hashlib.sha256(data).hexdigest() != expected["sha256"]:
                    return f"{file_name} does not match its checksum", {}, RecordMeta()
                files[file_name] = data
            return None, files, manifest["meta"]
        except FileNotFoundError as exc:
            return f"incomplete ({exc})", {}, RecordMeta()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"unreadable ({exc})", {}, RecordMeta()

    def _prune(self, kind: str, keep: int) -> None:
        for epoch in sorted(self._epochs(kind), reverse=True)[keep:]:
            self.fs.delete_dir(f"{self.root}/{kind}-{epoch:06d}")
