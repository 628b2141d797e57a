"""Coalescing a job's text chunks into fewer token events.

One event per token costs a stream entry (~70 bytes of Redis memory with its fields) and a
Lua call; clients cannot tell chunks that arrive within a few tens of milliseconds apart.
So text produced within ``interval_s`` of the last event is held and sent with the next
one: the first chunk goes out at once (time to first token is unchanged), and the job
runner flushes what is held before any other event and before the terminal one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class TextCoalescer:
    interval_s: float = 0.1
    clock: Callable[[], float] = time.monotonic
    _held: list[str] = field(default_factory=list)
    _last_sent: float | None = None

    def add(self, text: str) -> str | None:
        """Hold ``text``; returns what to send now (everything held) when the interval passed."""
        if text:
            self._held.append(text)
        now = self.clock()
        if self._held and (self._last_sent is None or now - self._last_sent >= self.interval_s):
            self._last_sent = now
            return self.flush()
        return None

    def flush(self) -> str | None:
        """Everything held, or ``None``."""
        if not self._held:
            return None
        text, self._held = "".join(self._held), []
        return text
