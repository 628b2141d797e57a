"""How many drafts each sequence of one step verifies: by expected value, across the batch.

Cost model (measured, docs/speculative.md): a decode step is bound by reading the weights,
so a step over ``M`` rows costs about ``1 + row_cost * (M - 1)`` one-row steps. A draft
whose chance of being emitted is ``p`` (it and all drafts before it of its sequence accepted)
adds ``p`` expected tokens for one more row. With ``T`` tokens expected from the step so far
over cost ``C``, it raises the step's tokens per second exactly when ``p * C > row_cost * T``.

The rule takes candidate drafts in order of decreasing ``p`` (within a sequence ``p`` never
grows, so each sequence keeps a prefix) while that holds, the token budget lasts, and ``p``
reaches ``min_chance``. At batch 1 (``T`` about 1) nearly any likely draft pays; in a batch
of 8 decoding sequences only drafts with ``p`` above ~0.25 do, so a copying sequence keeps
drafting while one with nothing to copy stops weighing on the others.
"""
from __future__ import annotations

import heapq
from typing import Sequence

from engine.speculative.policy import SpecConfig


def choose_drafts(chances: Sequence[Sequence[float]], decoding: int, config: SpecConfig,
                  room: int) -> list[int]:
    """For each sequence's draft chances (non-increasing), how many drafts to verify.
    ``decoding``: the sequences decoding in this step (each yields one token anyway);
    ``room``: drafts the step's token budget still allows."""
    counts = [0] * len(chances)
    heap = [(-c[0], index) for index, c in enumerate(chances) if c]
    heapq.heapify(heap)
    tokens, cost = float(max(decoding, 1)), 1.0 + config.row_cost * (max(decoding, 1) - 1)
    while heap and room > 0:
        negative, index = heapq.heappop(heap)
        chance = -negative
        if chance < config.min_chance or chance * cost <= config.row_cost * tokens:
            break                       # every remaining candidate is at most this likely
        counts[index] += 1
        tokens, cost, room = tokens + chance, cost + config.row_cost, room - 1
        following = chances[index]
        if counts[index] < len(following):
            heapq.heappush(heap, (-following[counts[index]], index))
    return counts
