"""Per-sequence speculation state: the drafter, and an estimate of how likely its drafts are
to be accepted, from which the draft length follows.

Why estimates and not a fixed k: a verified row is not free (on this CPU one more row costs
about 3-4% of a one-row step, see docs/speculative.md), and a draft token is only emitted
if every draft before it was accepted too. So the i-th draft of a step is worth its row only
when the chance that the first i drafts are all accepted is high enough; how high depends on
how many tokens the step yields anyway (in a batch of 8, one row buys much less than at
batch 1). :func:`engine.speculative.budget.choose_drafts` makes that choice over all
sequences of a step; this module supplies each sequence's chances.

The estimate is kept per matched n-gram length (a 3-token match predicts better than a
1-token one): the probability that one draft token is accepted given the previous ones were,
an exponential average over the draft tokens verified (accepted ones count 1, the first
rejected one 0, the ones after it are not judged). The chain probability of the i-th draft
is ``rate ** i``. A length whose drafts keep failing falls below what any step pays for,
so drafting stops by itself for a sequence with nothing to copy; each step it finds a match
but does not draft, its estimate drifts back toward the prior, so it probes again now and
then (a one-token probe, cheap) instead of giving up for good.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from engine.speculative.ngram import NgramDrafter


@dataclass(frozen=True)
class SpecConfig:
    """What one request speculates with (from settings, switched per request)."""

    num_tokens: int = 8             # most drafts per step (k)
    ngram_lengths: tuple[int, ...] = (4, 3, 2)
    prior: float = 0.6              # a fresh estimate: P(draft token accepted | previous were)
    alpha: float = 0.2              # weight of one judged draft token in the estimate
    recover: float = 0.03           # per matched-but-not-drafted step, drift back toward the prior
    row_cost: float = 0.05          # one more verified row, as a fraction of a one-row step
    min_chance: float = 0.1         # never draft a token less likely than this to be emitted


@dataclass
class Proposal:
    """One step's candidate drafts for a sequence: the tokens and, for each, the estimated
    probability that it and every draft before it are accepted (non-increasing)."""

    ngram: int = 0
    tokens: list[int] = field(default_factory=list)
    chances: list[float] = field(default_factory=list)


@dataclass
class SpecState:
    config: SpecConfig
    drafter: NgramDrafter
    drafted: int = 0          # draft tokens run through verify forwards
    accepted: int = 0         # of those, accepted
    verify_steps: int = 0
    rates: dict[int, float] = field(default_factory=dict)   # matched n -> acceptance estimate
    last_ngram: int = 0       # the match length of the drafts being verified

    @classmethod
    def start(cls, config: SpecConfig, tokens: Sequence[int]) -> "SpecState":
        drafter = NgramDrafter(tokens, config.ngram_lengths, config.num_tokens)
        return cls(config=config, drafter=drafter)

    def push(self, token: int) -> None:
        """One more accepted (final) token of the sequence."""
        self.drafter.append(token)

    def rate(self, ngram: int) -> float:
        return self.rates.get(ngram, self.config.prior)

    def propose(self, limit: int, tokens: Sequence[int] | None = None) -> Proposal:
        """Candidate drafts (at most ``limit``) after the sequence's accepted tokens
        (``tokens``, when given, are the sequence's ids now: the drafter catches up first)."""
        if tokens is not None:
            self.drafter.sync(tokens)
        if limit <= 0:
            return Proposal()
        ngram, drafts = self.drafter.match(limit)
        rate, chance, chances = self.rate(ngram), 1.0, []
        for _ in drafts:
            chance *= rate
            chances.append(chance)
        return Proposal(ngram, drafts, chances)

    def skip(self, proposal: Proposal) -> None:
        """A match was found but not drafted: let its estimate drift back toward the prior."""
        if proposal.tokens:
            rate = self.rate(proposal.ngram)
            self.rates[proposal.ngram] = rate + self.config.recover * (self.config.prior - rate)

    def begin(self, proposal: Proposal, count: int) -> list[int]:
        """``count`` of the proposal's drafts are verified this step (0: :meth:`skip`)."""
        if count <= 0:
            self.skip(proposal)
            return []
        self.last_ngram = proposal.ngram
        return proposal.tokens[:count]

    def record(self, drafted: int, accepted: int) -> None:
        """One verify step's outcome (for the drafts of the last :meth:`begin`)."""
        if drafted <= 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        self.verify_steps += 1
        alpha, rate = self.config.alpha, self.rate(self.last_ngram)
        for _ in range(accepted):
            rate += alpha * (1.0 - rate)
        if accepted < drafted:
            rate -= alpha * rate
        self.rates[self.last_ngram] = rate

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0
