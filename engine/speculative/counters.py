"""Per-worker speculative decoding totals, for the heartbeat (``engine.stats()``), the
``/metrics`` acceptance gauge and the monitor page.

Written only by the thread that runs generation; other threads (the heartbeat) only read
the integers, which is safe for a snapshot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SpecCounters:
    requests: int = 0               # requests that drafted at least once
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        if drafted > 0:
            self.requests += 1
            self.draft_tokens += drafted
            self.accepted_draft_tokens += accepted

    def stats(self) -> dict[str, Any]:
        rate = self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0
        return {"requests": self.requests, "draft_tokens": self.draft_tokens,
                "accepted_draft_tokens": self.accepted_draft_tokens, "acceptance_rate": round(rate, 4)}


def spec_counters(engine: Any) -> SpecCounters:
    """The engine's one counter set (shown as ``speculative`` in ``engine.stats()``)."""
    return engine.state("speculative", SpecCounters)
