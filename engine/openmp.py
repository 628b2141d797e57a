"""One OpenMP thread team per process: the engine loop's.

Why: torch (and our C kernels) run each multi-threaded op as an OpenMP parallel region, and
libgomp keeps a team of worker threads per *calling* thread. Between regions those workers
spin briefly before sleeping, so the next region starts at once, but only while the process
has no more OpenMP threads than CPUs: past that, libgomp "throttles" the spin to ~100
iterations and every region pays a futex wake-up. A second team (the thread that loaded the
model, a job thread that ran one big op) is enough on a 2-core machine: ``python -m
bench.openmp_teams`` measured q8 decode through the loop 1.40x faster, bf16 1.18x, once a
helper thread's team was released (results/openmp_teams.json, docs/quantization.md).

So the threads that are not the engine loop release their team after heavy torch work
(:func:`release_thread_team`: ``omp_pause_resource_all``, OpenMP 5.0), and the loop thread's
team is the only one left.
"""
from __future__ import annotations

import ctypes
import functools
import os
from typing import Any


@functools.lru_cache(maxsize=1)
def _libgomp() -> Any:
    """torch's libgomp when it is loaded (RTLD_NOLOAD: never load another), else None."""
    import torch  # noqa: F401 - loads torch's libgomp, the one to find

    try:
        lib = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        pause = lib.omp_pause_resource_all
    except (OSError, AttributeError):
        return None
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return lib


OMP_PAUSE_SOFT = 1


def release_thread_team() -> bool:
    """Free the calling thread's OpenMP worker threads (a later parallel region in this thread
    starts a new team). False where torch does not use libgomp. Cheap when there is none."""
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0
