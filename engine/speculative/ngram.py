"""Prompt-lookup drafting: propose the tokens that followed the last time the context's
current ending (an n-gram) occurred earlier in the prompt or the generated text.

Why an index and not a scan: a scan of the whole context per step costs O(context) and
grows with every token; the index is updated once per accepted token (one dict write per
configured n-gram length) and a draft is one dict read per length, so drafting stays
O(k + lengths) per step whatever the context size.

The index maps each n-gram to the position *just after* its most recent occurrence. It is
updated one token late: the n-grams ending at the newest token are added only when the
next token arrives, so a lookup of the current suffix never finds itself and always has
at least one following token to propose.

Following the copy: while the answer keeps writing what the last proposal drafted (accepted
drafts, then the bonus token), the next drafts continue that copy instead of jumping to the
suffix's most recent occurrence. Why: in a JSON array the items share their keys, so the
suffix ``"title": "`` last occurred in the *previous* item, not in the one being copied.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(slots=True)
class _Proposal:
    """A copy the drafter proposed: its match length, where it starts in the token list, and
    the sequence's length when it was proposed."""

    n: int
    start: int
    length: int = 0


class NgramDrafter:
    """Per-sequence n-gram index over prompt + accepted tokens (rejected drafts never enter)."""

    def __init__(self, tokens: Iterable[int], lengths: Sequence[int], max_draft: int) -> None:
        if not lengths or min(lengths) <= 0:
            raise ValueError("n-gram lengths must be positive")
        if max_draft <= 0:
            raise ValueError("max_draft must be positive")
        self.lengths = tuple(sorted(set(int(n) for n in lengths), reverse=True))
        self.max_draft = int(max_draft)
        self.tokens: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        self._pending: _Proposal | None = None   # the last proposal, judged when tokens arrive
        self._cursor: int | None = None          # where the followed copy goes on
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def continuation(self) -> int:
        """The match length reported for a followed copy (its own acceptance estimate)."""
        return self.lengths[0] + 1

    def append(self, token: int) -> None:
        """Add one accepted token (indexing the n-grams that end at the previous one)."""
        tokens, end = self.tokens, len(self.tokens)
        for n in self.lengths:
            if end >= n:
                self._index[tuple(tokens[end - n:end])] = end
        tokens.append(int(token))

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def sync(self, tokens: Sequence[int]) -> None:
        """Catch up with a sequence that grew (its first ``len(self)`` ids must be ours)."""
        if len(tokens) > len(self.tokens):
            self.extend(tokens[len(self.tokens):])

    def propose(self, limit: int | None = None) -> list[int]:
        """Up to ``min(limit, max_draft)`` next tokens after the longest matching suffix;
        [] when no configured suffix occurred before."""
        return self.match(limit)[1]

    def match(self, limit: int | None = None) -> tuple[int, list[int]]:
        """``(n, drafts)``: the length of the longest suffix that occurred before (or
        :attr:`continuation` for a followed copy) and up to ``min(limit, max_draft)`` tokens
        that followed it; ``(0, [])`` when none did."""
        want = self.max_draft if limit is None else min(limit, self.max_draft)
        self._follow()
        if want <= 0:
            return 0, []
        proposal = _Proposal(self.continuation, self._cursor) if self._cursor is not None else self._lookup()
        if proposal is None:
            return 0, []
        drafts = self.tokens[proposal.start:proposal.start + want]
        proposal.length = len(self.tokens)
        self._pending = proposal
        return (proposal.n, drafts) if drafts else (0, [])

    def _lookup(self) -> _Proposal | None:
        """The longest suffix seen before, and the position just after it."""
        tokens = self.tokens
        for n in self.lengths:
            if len(tokens) >= n:
                start = self._index.get(tuple(tokens[len(tokens) - n:]))
                if start is not None:
                    return _Proposal(n, start)
        return None

    def _follow(self) -> None:
        """Judge the last proposal by the tokens written since: the copy is followed while each
        of them is the copy's next token and the copy has not reached where they began."""
        proposal = self._pending
        if proposal is None or len(self.tokens) <= proposal.length:
            return
        self._pending, self._cursor = None, None
        cursor, end = proposal.start, proposal.length
        for token in self.tokens[end:]:
            if cursor >= end or token != self.tokens[cursor]:
                return
            cursor += 1
        if cursor < end:
            self._cursor = cursor
