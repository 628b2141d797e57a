"""Weights that a decode step streams whole, placed in transparent huge pages.

Why: at batch 1 a step reads every weight once, and with 4 KB pages those reads also wait on
page-table walks. On this kernel setting (``transparent_hugepage=madvise``, the common default)
heap memory gets 4 KB pages unless a mapping asks for more; a Q8_0 head read from 2 MB pages
streamed about 10% faster on a 2-core EPYC, whichever kernel layout read it. With the
interleaved GGUF weights in huge pages, Qwen2.5 Q4_K_M files decoded 1.15x (0.5B, 11 of 12
rounds) and 1.10x (1.5B, 11 of 12) faster at batch 1, two loaded engines taking turns. The
``q8`` path's weights gained nothing measurable the same way (0.5B, 5 of 10) and stay in the
heap. Where the kernel or Python has no ``MADV_HUGEPAGE`` this is ordinary anonymous memory.

The price is at load: ``madvise`` also makes the kernel compact memory to find free 2 MB
blocks when a page is first written, so a start takes longer on a host whose memory is
fragmented (a Qwen2.5-1.5B file's second start: 3.0 s to ready without huge pages, 4.5-9.0 s
with them on this machine, as it varied). Writing the weights to 4 KB pages and collapsing
them afterwards (``MADV_COLLAPSE``) was no faster (5.9-9.7 s). So the interleaved weights now
live in a mapped cache file, in 2 MB page-cache folios mapped as 2 MB pages
(:mod:`engine.quant.interleaved_cache`); this arena holds them only where that file cannot
be written.
"""
from __future__ import annotations

import math
import mmap

import torch


def huge_page_empty(shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised tensor in its own anonymous mapping, advised for huge pages (the
    mapping lives as long as the tensor does)."""
    count = math.prod(shape)
    buffer = mmap.mmap(-1, max(count * dtype.itemsize, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buffer.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(shape)


class HugePageArena:
    """Tensors carved one after another out of huge-page mappings of ``chunk_bytes`` each, so
    that the many small weights of a model (a 0.5B layer's projections are 0.1-3 MB) share 2 MB
    pages too; a tensor of more than a quarter of a chunk gets a mapping of its own. The unused
    tail of a chunk is never touched, so it takes no memory."""

    def __init__(self, chunk_bytes: int = 64 << 20) -> None:
        self.chunk_bytes = chunk_bytes
        self._chunk: torch.Tensor | None = None
        self._used = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self.chunk_bytes // 4:
            return huge_page_empty(shape, dtype)
        if self._chunk is None or self._used + nbytes > self.chunk_bytes:
            self._chunk, self._used = huge_page_empty((self.chunk_bytes,)), 0
        start = self._used
        self._used += -(-nbytes // 64) * 64          # each tensor 64-byte aligned
        return self._chunk[start:start + nbytes].view(dtype).view(shape)
