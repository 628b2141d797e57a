"""Per-sequence speculation state: the drafter, the acceptance counters, and the rule that
turns drafting off for a sequence whose drafts keep being rejected.

Why adaptive: a verify forward of ``1 + k`` tokens costs more than a one-token step (a
little on a weight-bound CPU, more under quantized kernels tuned for one row). When the
drafts are mostly wrong, that cost buys nothing; so when the recent acceptance rate (an
exponential average over verify steps) falls below ``min_rate``, drafting pauses for
``backoff`` steps, and the pause doubles each time it happens again (up to ``max_backoff``).
A sequence that copies well never pauses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from engine.speculative.ngram import NgramDrafter


@dataclass(frozen=True)
class SpecConfig:
    """What one request speculates with (from settings, switched per request)."""

    num_tokens: int = 4
    ngram_lengths: tuple[int, ...] = (3, 2)
    min_rate: float = 0.3
    ema_alpha: float = 0.3
    backoff: int = 8
    max_backoff: int = 256


@dataclass
class SpecState:
    config: SpecConfig
    drafter: NgramDrafter
    drafted: int = 0          # draft tokens run through verify forwards
    accepted: int = 0         # of those, accepted
    verify_steps: int = 0
    rate: float = 1.0         # recent acceptance (EMA over verify steps)
    paused_for: int = 0       # steps left without drafting
    next_backoff: int = field(default=0)

    @classmethod
    def start(cls, config: SpecConfig, tokens: Sequence[int]) -> "SpecState":
        drafter = NgramDrafter(tokens, config.ngram_lengths, config.num_tokens)
        return cls(config=config, drafter=drafter, next_backoff=config.backoff)

    def push(self, token: int) -> None:
        """One more accepted (final) token of the sequence."""
        self.drafter.append(token)

    def propose(self, limit: int, tokens: Sequence[int] | None = None) -> list[int]:
        """At most ``limit`` drafts after the sequence's accepted tokens (``tokens``, when
        given, are the sequence's ids now: the drafter catches up with them first)."""
        if tokens is not None:
            self.drafter.sync(tokens)
        if limit <= 0:
            return []
        if self.paused_for > 0:
            self.paused_for -= 1
            return []
        return self.drafter.propose(limit)

    def record(self, drafted: int, accepted: int) -> None:
        """One verify step's outcome; may pause drafting."""
        if drafted <= 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        self.verify_steps += 1
        cfg = self.config
        self.rate = (1 - cfg.ema_alpha) * self.rate + cfg.ema_alpha * (accepted / drafted)
        if self.rate < cfg.min_rate:
            self.paused_for = self.next_backoff
            self.next_backoff = min(cfg.max_backoff, self.next_backoff * 2)
            self.rate = 1.0 - (1.0 - cfg.min_rate) / 2   # a fresh chance after the pause

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0
