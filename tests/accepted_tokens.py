"""What the engine loop did, read on its own thread rather than off a clock or a stream.

Every generation method hands each token it makes to :meth:`GenerationRun.accept`, on the
loop thread. Recording those calls gives the loop's work in the order it did it, with no
consumer thread between (text held back for an incomplete character, or a consumer not
scheduled, looks like no progress from outside) and nothing of what the other processes on
a shared machine do.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from engine.run import GenerationRun


@dataclass(frozen=True)
class Accepted:
    method: str
    at: float  # time.perf_counter() on the loop thread


def record_accepted(monkeypatch: pytest.MonkeyPatch) -> list[Accepted]:
    """Every token accepted from now on (until ``monkeypatch`` is undone), in order."""
    accepted: list[Accepted] = []
    accept = GenerationRun.accept

    def recording(run: GenerationRun, token_id: int) -> bool:
        accepted.append(Accepted(run.method, time.perf_counter()))
        return accept(run, token_id)

    monkeypatch.setattr(GenerationRun, "accept", recording)
    return accepted
