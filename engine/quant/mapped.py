"""Keep a read-mostly table in a file and map it, so only the pages a worker reads are resident.

Why: a decode step reads one row of the embedding per token, so a worker that holds the whole
table in its heap pays ~100 MB (the default model's packed 5-bit table) for rows it may never
read. llama.cpp maps its GGUF file and pays for the pages its tokens touch; this does the same
for our quantized table. The file is content-addressed (a hash of the bytes in its name), so a
stale file cannot be picked up, workers of one machine share one copy in the page cache, and a
worker that finds the file already written only maps it.

The mapping is private (copy-on-write): reading shares the file's pages; a write, which nothing
does, would copy the page instead of touching the file. Two kernel behaviours would otherwise
make every row cost far more than its page (measured: 50 MB resident after 30 random rows of
the default model's table, 0.12 MB with both handled): a freshly written file sits in the page
cache as large folios, and a fault maps a whole folio; and readahead reads around each fault.
So the file's unmapped cached pages are dropped before mapping (they come back one page per
fault) and the mapping is advised as random access.
"""
from __future__ import annotations

import hashlib
import logging
import mmap
import os
import tempfile
from pathlib import Path

import torch

from core.logs import log_event

logger = logging.getLogger("miniserve.engine.quant.mapped")
ALIGN = 64  # each tensor starts on a cache line


def map_tensors(tensors: list[torch.Tensor], directory: Path) -> list[torch.Tensor] | None:
    """Copies of ``tensors`` (same dtype, shape and values) that read from one file under
    ``directory`` through a private file mapping; None, with a WARNING event, when the file cannot be written there
    (the caller keeps its in-memory tensors)."""
    if any(t.device.type != "cpu" for t in tensors):
        return None
    parts = [t.contiguous().view(torch.uint8).reshape(-1) for t in tensors]
    offsets = _offsets([p.numel() for p in parts])
    try:
        path = _write_once(parts, offsets, Path(directory))
        with open(path, "rb") as handle:
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # pages others map stay
            region = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
        region.madvise(mmap.MADV_RANDOM)
    except OSError as exc:
        log_event(logger, "table_not_mapped", level=logging.WARNING, reason=str(exc),
                  mb=round(sum(p.numel() for p in parts) / 2**20, 1))
        return None
    whole = torch.frombuffer(region, dtype=torch.uint8)  # keeps ``region`` alive
    return [whole[start:start + part.numel()].view(t.dtype).reshape(t.shape)
            for t, part, start in zip(tensors, parts, offsets)]


def resident_bytes(tensor: torch.Tensor) -> int | None:
    """Bytes of the file mapping behind ``tensor`` that this process has resident (from
    ``/proc/self/smaps``), or None when ``tensor`` is not in such a mapping."""
    address = tensor.data_ptr()
    try:
        with open("/proc/self/smaps") as smaps:
            inside = False
            for line in smaps:
                fields = line.split()
                head = fields[0]
                if "-" in head and not head.endswith(":"):
                    low, high = (int(x, 16) for x in head.split("-"))
                    inside = low <= address < high and len(fields) > 5 and fields[5].startswith("/")
                elif inside and head == "Rss:":
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _offsets(sizes: list[int]) -> list[int]:
    offsets, position = [], 0
    for size in sizes:
        offsets.append(position)
        position += -(-size // ALIGN) * ALIGN
    return offsets


def _write_once(parts: list[torch.Tensor], offsets: list[int], directory: Path) -> Path:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.numpy().data)
    total = offsets[-1] + parts[-1].numel() if parts else 0
    path = directory / f"{digest.hexdigest()[:32]}.bin"
    if path.is_file() and path.stat().st_size == total:
        return path
    directory.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(dir=directory, suffix=".part")
    try:
        with os.fdopen(handle, "wb") as out:
            for part, start in zip(parts, offsets):
                out.seek(start)
                out.write(part.numpy().data)
            out.truncate(total)
            out.flush()
            os.fdatasync(out.fileno())  # written back, so that its cached pages can be dropped
        os.chmod(scratch, 0o644)
        os.replace(scratch, path)  # atomic: a concurrent worker maps either file, both equal
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise
    return path
