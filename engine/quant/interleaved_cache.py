"""A GGUF file's interleaved matrices kept in a file of their own, mapped at every start.

Why: the matrices this CPU's kernels read interleaved by 16 rows (:mod:`engine.gguf_weights`)
used to be moved into fresh anonymous memory at every start. On a virtual machine that backs
guest memory at first touch, a fresh page costs far more than the moving: perf over a 3B
Q4_K_M file's start put 66% of it in the kernel's page zeroing, and the interleaving took
6-11 s of a 9-14 s load, where llama.cpp maps its file (already in the page cache) in about
two. So the first start writes the interleaved bytes here, streamed through one small buffer,
and its weights are views of the file's mapping; a later start only maps the finished file,
whose pages are already in the page cache, and moves nothing.

The name hashes a format version, the kernel library's build key (its sources, flags and CPU:
a changed layout is a new file, never a stale one), and the GGUF's path, size and modification
time. The Python side's choices are not hashed: a change to the rows' order at load (a llama
file's q and k rows put back, :mod:`engine.gguf_weights`) bumps the format. ``<key>.bin`` is
complete once ``<key>.json``, its table of contents, exists: both are renamed into place at
the end of a load. Writers of one key take turns under a file lock, so
workers that start together write it once. A finished file replaces the older files of the
same GGUF. The file's space is reserved before anything is written; where that fails (a full
disk) or the folder cannot be written, the load interleaves in memory as before, logged.
Deleting the folder is always safe.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import os
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

import numpy as np
import torch

from core.logs import log_event
from engine.quant import native

logger = logging.getLogger("miniserve.engine.quant.interleaved_cache")
FORMAT = 1          # bump when the table of contents, the placement below or the rows' order changes
ALIGN = 64          # each matrix starts on a cache line, right after the one before
# The file is written in whole 2 MB runs from its start: the page cache then holds it in 2 MB
# folios, which the mapping maps with 2 MB pages (``FilePmdMapped`` in smaps), as the huge
# anonymous pages did. Matrices aligned to 2 MB each, written matrix by matrix, left a quarter
# of a 1.5B file's bytes (the small matrices, every large one's tail) in 4 KB pages.
HUGE = 2 << 20
STAGE = 4 * HUGE    # bytes gathered before a write


@dataclass(frozen=True)
class Entry:
    """Where one matrix's interleaved bytes lie in the file, and what they must be."""

    offset: int
    ggml_type: int
    rows: int
    row_bytes: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


def cache_key(gguf: Path) -> str:
    stat = gguf.stat()
    identity = json.dumps({"format": FORMAT, "kernels": native.build().stem, "gguf": str(gguf.resolve()),
                           "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


def _mapping(file: BinaryIO, size: int) -> mmap.mmap:
    """The file read-only, advised for huge pages: where it is no longer in the page cache (a
    reboot), the kernel then reads it back in 2 MB folios, which map as 2 MB pages again."""
    buffer = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buffer.madvise(mmap.MADV_HUGEPAGE)
    return buffer


def _view(buffer: mmap.mmap, entry: Entry) -> torch.Tensor:
    """A read-only mapping's bytes as a uint8 tensor ``[rows, row_bytes]`` (no copy; nothing writes it)."""
    array = np.frombuffer(buffer, dtype=np.uint8, count=entry.nbytes, offset=entry.offset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # "The given buffer is not writable"
        return torch.from_numpy(array.reshape(entry.rows, entry.row_bytes))


class InterleavedCache:
    """The interleaved matrices of one GGUF under ``directory``: read from a finished file
    (:meth:`lookup`), or written to a new one (:meth:`add` and :meth:`append` per matrix,
    then :meth:`finish` or :meth:`abandon`)."""

    def __init__(self, directory: Path, gguf: Path) -> None:
        self.directory, self.gguf = directory, gguf
        self.key = cache_key(gguf)
        self.data_path, self.toc_path = directory / f"{self.key}.bin", directory / f"{self.key}.json"
        self.entries: dict[str, Entry] = {}
        self.hits = 0
        self._started = time.perf_counter()
        self._buffer: mmap.mmap | None = None   # the file's mapping (a finished one, or the one being written)
        self._lock: TextIO | None = None        # a writer's lock,
        self._file: BinaryIO | None = None      # temporary file,
        self._capacity = self._end = 0          # its reserved size and the end of its last matrix,
        self._stage = np.empty(0, dtype=np.uint8)   # and the bytes gathered from _flushed on
        self._flushed = self._staged = 0
        self._gave_up = False

    @classmethod
    def open(cls, directory: Path, gguf: Path, capacity: int) -> InterleavedCache | None:
        """The finished file of this GGUF, or a new one of at most ``capacity`` bytes being
        written (None, logged, when the folder cannot be written or has no room for it)."""
        cache = None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            cache = cls(directory, gguf)
            if not cache._read():
                cache._begin_writing(capacity)
            return cache
        except OSError as exc:
            if cache is not None:
                cache.abandon()
            log_event(logger, "interleaved_cache_unavailable", level=logging.WARNING, error=type(exc).__name__)
            return None

    @property
    def writing(self) -> bool:
        return self._file is not None

    def _read(self) -> bool:
        try:
            toc = json.loads(self.toc_path.read_text())
            entries = {name: Entry(**fields) for name, fields in toc["entries"].items()}
            with open(self.data_path, "rb") as file:
                if os.fstat(file.fileno()).st_size != toc["size"] or toc["format"] != FORMAT:
                    return False
                buffer = _mapping(file, 0) if toc["size"] else None
        except (OSError, ValueError, KeyError, TypeError):
            return False
        self._buffer, self.entries = buffer, entries
        return True

    def _begin_writing(self, capacity: int) -> None:
        """Take the key's lock (another worker may be writing it: then its finished file is
        read), reserve ``capacity`` bytes of disk and map them."""
        self._lock = open(self.directory / f"{self.key}.lock", "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        if self._read():
            self._unlock()
            return
        fd, name = tempfile.mkstemp(dir=self.directory, prefix=f".{self.key}.", suffix=".part")
        self._file, self._temp = os.fdopen(fd, "r+b"), Path(name)
        self._capacity = max(capacity, 1)
        os.posix_fallocate(fd, 0, self._capacity)   # no write below can then find the disk full
        self._buffer = _mapping(self._file, self._capacity)
        self._stage = np.empty(STAGE, dtype=np.uint8)

    def lookup(self, name: str, ggml_type: int, rows: int, row_bytes: int) -> torch.Tensor | None:
        """Matrix ``name``'s interleaved bytes from a finished file (None: not in it)."""
        entry = self.entries.get(name)
        if self.writing or entry is None or entry != Entry(entry.offset, ggml_type, rows, row_bytes):
            return None
        self.hits += 1
        return _view(self._buffer, entry)

    def add(self, name: str, ggml_type: int, rows: int, row_bytes: int) -> torch.Tensor | None:
        """Where matrix ``name`` goes, at the file's end: its :meth:`append` ed bytes, readable
        once :meth:`finish` has run (a load runs no weight before). None when this cache is not
        being written or has no room left."""
        entry = Entry(-(-self._end // ALIGN) * ALIGN, ggml_type, rows, row_bytes)
        if not self.writing or entry.offset + entry.nbytes > self._capacity:
            return None
        self._put_bytes(np.zeros(entry.offset - self._end, dtype=np.uint8))   # the gap before it
        self.entries[name], self._end = entry, entry.offset
        return _view(self._buffer, entry)

    def append(self, data: torch.Tensor) -> None:
        """The last added matrix's next rows (contiguous bytes, in order)."""
        self._put_bytes(data.numpy().reshape(-1))

    def _put_bytes(self, source: np.ndarray) -> None:
        self._end += source.size
        while source.size:
            take = min(source.size, STAGE - self._staged)
            self._stage[self._staged:self._staged + take] = source[:take]
            self._staged += take
            source = source[take:]
            if self._staged == STAGE:
                self._flush()

    def _flush(self) -> None:
        view = memoryview(self._stage)[:self._staged]
        while view:   # the space is reserved: a short write only means "go on"
            done = os.pwrite(self._file.fileno(), view, self._flushed)
            view, self._flushed = view[done:], self._flushed + done
        self._staged = 0

    def finish(self) -> None:
        """Put a written file and its table of contents in place, drop the GGUF's older files, log."""
        outcome = "given up" if self._gave_up else "written" if self.writing else "read"
        if self.writing:
            self._flush()
            last = max((e.offset + e.nbytes for e in self.entries.values()), default=0)
            if self._flushed != last:
                raise RuntimeError(f"interleaved cache: {self._flushed} bytes written, the matrices end at {last}")
            self._file.truncate(self._flushed)   # the reserve's unused tail (no mapped byte lies there)
            self._file.close()
            os.replace(self._temp, self.data_path)
            toc = {"format": FORMAT, "gguf": str(self.gguf.resolve()), "size": self._flushed,
                   "entries": {name: asdict(entry) for name, entry in self.entries.items()}}
            fd, name = tempfile.mkstemp(dir=self.directory, prefix=f".{self.key}.", suffix=".json")
            with os.fdopen(fd, "w") as out:
                json.dump(toc, out)
            os.replace(name, self.toc_path)
            self._file, self._stage = None, np.empty(0, dtype=np.uint8)
            self._unlock()
            self._drop_older(toc["gguf"])
        log_event(logger, "interleaved_cache", outcome=outcome, matrices=len(self.entries),
                  latency_ms=int((time.perf_counter() - self._started) * 1000))

    def abandon(self) -> None:
        """Give up writing: a failed load's file is removed."""
        if self.writing:
            self._gave_up = True
            self._file.close()
            self._temp.unlink(missing_ok=True)
            self._file, self.entries = None, {}
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()   # releases the flock
            self._lock = None

    def _drop_older(self, gguf: str) -> None:
        """Files an earlier build or an older copy of the same GGUF left (a worker still mapping
        one keeps reading it: an unlinked file lives while mapped)."""
        for toc_path in self.directory.glob("*.json"):
            if toc_path == self.toc_path:
                continue
            try:
                if json.loads(toc_path.read_text()).get("gguf") != gguf:
                    continue
                toc_path.unlink()
                toc_path.with_suffix(".bin").unlink(missing_ok=True)
            except (OSError, ValueError):
                continue
