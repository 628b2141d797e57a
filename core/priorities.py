"""Priority classes: which waiting work goes first (docs/scheduling.md).

A job's class decides its order twice: at the fair gate in front of its Celery queue
(core/fair_gate.py: a higher class is always released first) and in the engine loop's
paged scheduler (``Sequence.priority``: admitted first, preempted last under KV pressure).
Within a class, API keys take turns. Torch-free: web, worker and engine all read it.
"""
from __future__ import annotations

PRIORITY_CLASSES = ("interactive", "default", "batch")  # most urgent first
INTERACTIVE, DEFAULT, BATCH = PRIORITY_CLASSES


def rank(priority: str | None) -> int:
    """0 for ``interactive`` .. 2 for ``batch`` (the engine's ``Sequence.priority``); unknown
    or missing is ``default``, the class of jobs stored before classes existed."""
    return PRIORITY_CLASSES.index(priority) if priority in PRIORITY_CLASSES else 1


def capped(priority: str, cap: str | None) -> str:
    """``priority`` lowered to ``cap`` when the cap is a lower class."""
    if cap is None:
        return priority
    return PRIORITY_CLASSES[max(rank(priority), rank(cap))]

