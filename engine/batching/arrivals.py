"""Requests on their way to the engine loop, counted by priority class.

A job thread counts its request in when it puts it in the loop's inbox; the loop counts it
out when it takes it. While a step of lower classes runs, the forward asks between layers
whether a better class has arrived (:class:`Interrupt`): if so, the step yields and the
newcomer's prompt takes the next step, so an interactive chat waits a layer, not a whole
batch step (engine/batching/scheduler.py). The best class in flight is also kept in a C int
(``flag``) that the one-call C step reads between layers while the loop thread is inside it
(ctypes releases the GIL for that call).
"""
from __future__ import annotations

import ctypes
import threading
from collections import Counter
from dataclasses import dataclass

NONE = 2**31 - 1   # the flag's value when nothing is on its way in


class Arrivals:
    """Counts of requests in flight to the loop, by class (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[int] = Counter()
        self.flag = ctypes.c_int32(NONE)   # the best class in flight, for C to read

    def came(self, priority: int) -> None:
        with self._lock:
            self._counts[priority] += 1
            self.flag.value = min(self._counts)

    def taken(self, priority: int) -> None:
        with self._lock:
            self._counts[priority] -= 1
            if self._counts[priority] <= 0:
                del self._counts[priority]
            self.flag.value = min(self._counts, default=NONE)

    def best(self) -> int | None:
        """The best (smallest) class in flight, or None."""
        value = self.flag.value
        return None if value == NONE else value


@dataclass(frozen=True)
class Interrupt:
    """What a step whose best class is ``rank`` asks between layers: has a better class come in?"""

    arrivals: Arrivals
    rank: int

    def __call__(self) -> bool:
        return self.arrivals.flag.value < self.rank

    @property
    def address(self) -> int:
        """Where the C step reads the flag."""
        return ctypes.addressof(self.arrivals.flag)
