"""A GGUF file's interleaved matrices kept in a file of their own, mapped at every start.

Why: the matrices this CPU's kernels read interleaved by 16 rows (:mod:`engine.gguf_weights`)
used to be moved into fresh anonymous memory at every start. On a virtual machine that backs
guest memory at first touch, a fresh page costs far more than the moving: perf over a 3B
Q4_K_M file's start put 66% of it in the kernel's page zeroing, and the interleaving took
6-11 s of a 9-14 s load, where llama.cpp maps its file (already in the page cache) in about
two. So the first start writes the interleaved bytes here, slab by slab through one reused
buffer, and maps each matrix as soon as it is written; a later start only maps the file, whose
pages are already in the page cache. Read by the kernels, these pages streamed as fast as
the huge anonymous pages they replace (2 threads over 256 MB on a 2-core EPYC: 32 GB/s against
33, and 27-31 for plain 4 KB anonymous pages), as ext4 caches a written file in large folios.

The name hashes a format version, the kernel library's build key (its sources, flags and CPU:
a changed layout is a new file, never a stale one), and the GGUF's path, size and modification
time. ``<key>.bin`` is complete once ``<key>.json``, its table of contents, exists: both are
renamed into place at the end of a load. Writers of one key take turns under a file lock, so
workers that start together write it once. A finished file replaces the older files of the
same GGUF. Space for each matrix is reserved before it is written; where that fails (a full
disk) or the folder cannot be written, the rest of the load interleaves in memory as before,
logged. Deleting the folder is always safe.
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

import numpy as np
import torch

from core.logs import log_event
from engine.quant import native

logger = logging.getLogger("miniserve.engine.quant.interleaved_cache")
FORMAT = 1          # bump when the table of contents or the placement below changes
# Each matrix starts on a 2 MB boundary of the file and is written in whole 2 MB runs: the page
# cache then holds it in 2 MB folios, which a mapping maps with 2 MB pages (``FilePmdMapped``),
# as the huge anonymous pages did. The gaps are holes: they take no disk.
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


def _advised(buffer: mmap.mmap) -> mmap.mmap:
    """Advised for huge pages: where the file is no longer in the page cache (a reboot), the
    kernel then reads it back in 2 MB folios, which map as 2 MB pages again."""
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buffer.madvise(mmap.MADV_HUGEPAGE)
    return buffer


def _view(buffer: mmap.mmap, start: int, entry: Entry) -> torch.Tensor:
    """A read-only mapping's bytes as a uint8 tensor ``[rows, row_bytes]`` (no copy; nothing writes it)."""
    array = np.frombuffer(buffer, dtype=np.uint8, count=entry.nbytes, offset=start).reshape(entry.rows, entry.row_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # "The given buffer is not writable"
        return torch.from_numpy(array)


class InterleavedCache:
    """The interleaved matrices of one GGUF under ``directory``: read from a finished file
    (:meth:`lookup`), or written to a new one (:meth:`reserve`, :meth:`append`, :meth:`mapped`,
    then :meth:`finish` or :meth:`abandon`)."""

    def __init__(self, directory: Path, gguf: Path) -> None:
        self.directory, self.gguf = directory, gguf
        self.key = cache_key(gguf)
        self.data_path, self.toc_path = directory / f"{self.key}.bin", directory / f"{self.key}.json"
        self.entries: dict[str, Entry] = {}
        self.hits = self.written = 0
        self._started = time.perf_counter()
        self._buffer: mmap.mmap | None = None   # a finished file's mapping
        self._lock = self._file = None          # a writer's lock and temporary file
        self._end = 0
        self._pending: tuple[str, Entry] | None = None
        self._written_to = 0
        self._stage: np.ndarray | None = None   # a writer's gathered bytes, _staged of them
        self._staged = 0
        self._gave_up = False

    @classmethod
    def open(cls, directory: Path, gguf: Path) -> InterleavedCache | None:
        """The finished file of this GGUF, or a new one being written (None, logged, when the
        folder cannot be written)."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
            cache = cls(directory, gguf)
            if not cache._read():
                cache._begin_writing()
            return cache
        except OSError as exc:
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
                buffer = _advised(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)) if toc["size"] else None
        except (OSError, ValueError, KeyError, TypeError):
            return False
        self._buffer, self.entries = buffer, entries
        return True

    def _begin_writing(self) -> None:
        """Take the key's lock (another worker may be writing it: then its finished file is read)."""
        self._lock = open(self.directory / f"{self.key}.lock", "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        if self._read():
            self._unlock()
            return
        fd, name = tempfile.mkstemp(dir=self.directory, prefix=f".{self.key}.", suffix=".part")
        self._file, self._temp = os.fdopen(fd, "r+b"), Path(name)

    def lookup(self, name: str, ggml_type: int, rows: int, row_bytes: int) -> torch.Tensor | None:
        """Matrix ``name``'s interleaved bytes from a finished file (None: not in it)."""
        entry = self.entries.get(name)
        if self._buffer is None or entry is None or entry != Entry(entry.offset, ggml_type, rows, row_bytes):
            return None
        self.hits += 1
        return _view(self._buffer, entry.offset, entry)

    def reserve(self, name: str, ggml_type: int, rows: int, row_bytes: int) -> bool:
        """Room for matrix ``name`` at the file's end; False (the cache given up, logged) when the
        space cannot be had, or when this cache is not being written."""
        if not self.writing:
            return False
        entry = Entry(-(-self._end // HUGE) * HUGE, ggml_type, rows, row_bytes)
        try:
            os.posix_fallocate(self._file.fileno(), entry.offset, max(entry.nbytes, 1))
        except OSError as exc:
            log_event(logger, "interleaved_cache_unavailable", level=logging.WARNING, error=type(exc).__name__)
            self.abandon()
            return False
        self._pending, self._written_to = (name, entry), entry.offset
        if self._stage is None:
            self._stage = np.empty(STAGE, dtype=np.uint8)
        return True

    def append(self, data: torch.Tensor) -> None:
        """The reserved matrix's next rows (contiguous bytes, in order), gathered into whole runs."""
        source = data.numpy().reshape(-1)
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
            done = os.pwrite(self._file.fileno(), view, self._written_to)
            view, self._written_to = view[done:], self._written_to + done
        self._staged = 0

    def mapped(self) -> torch.Tensor:
        """The reserved matrix, once every row is appended, read back through a mapping of the file."""
        self._flush()
        name, entry = self._pending
        if self._written_to != entry.offset + entry.nbytes:
            raise RuntimeError(f"{name}: {self._written_to - entry.offset} of {entry.nbytes} bytes written")
        self.entries[name], self._pending, self._end = entry, None, self._written_to
        self.written += 1
        buffer = _advised(mmap.mmap(self._file.fileno(), max(entry.nbytes, 1), access=mmap.ACCESS_READ,
                                    offset=entry.offset))
        return _view(buffer, 0, entry)

    def finish(self) -> None:
        """Put a written file and its table of contents in place, drop the GGUF's older files, log."""
        outcome = "given up" if self._gave_up else "written" if self.writing else "read"
        if self.writing:
            self._file.close()
            os.replace(self._temp, self.data_path)
            toc = {"format": FORMAT, "gguf": str(self.gguf.resolve()), "size": self.data_path.stat().st_size,
                   "entries": {name: asdict(entry) for name, entry in self.entries.items()}}
            fd, name = tempfile.mkstemp(dir=self.directory, prefix=f".{self.key}.", suffix=".json")
            with os.fdopen(fd, "w") as out:
                json.dump(toc, out)
            os.replace(name, self.toc_path)
            self._file = None
            self._unlock()
            self._drop_older(toc["gguf"])
        log_event(logger, "interleaved_cache", outcome=outcome, matrices=self.hits or self.written,
                  latency_ms=int((time.perf_counter() - self._started) * 1000))

    def abandon(self) -> None:
        """Give up writing (matrices already mapped stay readable: their file lives while mapped)."""
        if self.writing:
            self._gave_up = True
            self._file.close()
            self._temp.unlink(missing_ok=True)
            self._file = None
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
