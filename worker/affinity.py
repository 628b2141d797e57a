"""Pin a worker process, every thread of it, to the CPUs of ``MINISERVE_WORKER_CPUS``.

Why: a threads-pool worker runs its job threads, the engine loop and Celery's consumer under
one GIL. When the kernel spreads those threads over several cores, every GIL hand-off
crosses cores; with several workers on one host that costs about a quarter of each worker's
throughput (``python -m bench.scale``, part a). One worker per core, pinned, keeps them apart.
Threads started later inherit the mask of the thread that starts them, so pinning the threads
that exist at start-up covers the rest.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from core.logs import log_event

logger = logging.getLogger("miniserve.worker")


class AffinityError(RuntimeError):
    """MINISERVE_WORKER_CPUS names CPUs this process may not use."""


def pin_process(cpus: tuple[int, ...], torch_threads: int = 0) -> list[int]:
    """Restrict all current threads of this process to ``cpus``; returns the thread ids pinned.

    Empty ``cpus`` leaves everything as it is. Raises :class:`AffinityError` when a CPU is
    not available to this process (a start error, not a silent fallback)."""
    if not cpus:
        return []
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(cpus) - allowed)
    if missing:
        raise AffinityError(f"MINISERVE_WORKER_CPUS names CPUs {missing}, but this process may only use "
                            f"{sorted(allowed)}")
    pinned = []
    for tid in _thread_ids():
        try:
            os.sched_setaffinity(tid, set(cpus))
            pinned.append(tid)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    log_event(logger, "worker_pinned", cpus=list(cpus), threads=len(pinned))
    if torch_threads > len(cpus):
        log_event(logger, "worker_cpus_oversubscribed", level=logging.WARNING, cpus=len(cpus),
                  torch_threads=torch_threads)
    return pinned


def _thread_ids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc/self/task").iterdir()]
