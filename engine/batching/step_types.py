"""The plain data of one scheduler step: what it returns, its running counters, and the
prompt-token budget it spends (engine/batching/scheduler.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.batching.sequence import Sequence


@dataclass
class StepOutput:
    """What one :meth:`Scheduler.step` did: tokens run through the forward (0: idle), the
    sequences that took tokens and go on, and those that ended (finished, failed, cancelled)."""

    computed: int = 0
    streamed: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)


@dataclass
class StepStats:
    steps: int = 0
    tokens: int = 0            # tokens run through the forward
    sampled: int = 0           # tokens produced
    preemptions: int = 0
    last_batch_size: int = 0
    last_num_tokens: int = 0
    max_batch_size: int = 0
    finished: int = 0
    draft_tokens: int = 0      # speculative drafts verified
    accepted_draft_tokens: int = 0
    yielded: int = 0           # steps stopped for a better class's arrival (see Scheduler._interrupt)


@dataclass
class PromptBudget:
    """The prompt tokens one step may still add: ``total`` (the step's token budget after its
    decodes), of which long prompts' chunks may take ``chunk`` while sequences decode, and
    prompts whose whole rest fits ``short`` take that rest at once from ``short``."""

    total: int
    chunk: int
    short: int

    @property
    def left(self) -> bool:
        return self.total > 0 and (self.chunk > 0 or self.short > 0)

    def grant(self, rest: int) -> int:
        if 0 < rest <= min(self.short, self.total):
            return rest
        return min(rest, self.chunk, self.total)

    def spend(self, rest: int, count: int) -> None:
        self.total -= count
        if 0 < rest <= self.short and count == rest:
            self.short -= count
        else:
            self.chunk = max(0, self.chunk - count)
