"""Requests on their way to the engine loop, counted by priority class.

A job thread counts its request in when it puts it in the loop's inbox; the loop counts it
out when it takes it. While a step of lower classes runs, the forward asks between layers
whether a better class has arrived (:meth:`Arrivals.best`): if so, the step yields and the
newcomer's prompt takes the next step, so an interactive chat waits a layer, not a whole
batch step (engine/batching/scheduler.py).
"""
from __future__ import annotations

import threading
from collections import Counter


class Arrivals:
    """Counts of requests in flight to the loop, by class (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[int] = Counter()

    def came(self, priority: int) -> None:
        with self._lock:
            self._counts[priority] += 1

    def taken(self, priority: int) -> None:
        with self._lock:
            self._counts[priority] -= 1
            if self._counts[priority] <= 0:
                del self._counts[priority]

    def best(self) -> int | None:
        """The best (smallest) class in flight, or None."""
        with self._lock:
            return min(self._counts, default=None)
