"""Suite-wide hygiene: hand each test module's freed memory back to the OS.

Several modules load the real model (bf16, fp32, quantized); glibc keeps the freed pages of
their many per-layer tensors in the heap, so the single pytest process would hold them for
the rest of the suite. (The larger cause of the ~21 GB the suite once reached was engines
kept alive by their loop threads: real-model fixtures now ``close()`` their engines.)
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc

import pytest


@pytest.fixture(scope="module", autouse=True)
def _release_memory_after_module():
    yield
    gc.collect()
    try:  # glibc only (engine.packed.release_freed_memory does the same; importing it loads torch)
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass
