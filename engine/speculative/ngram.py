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
"""
from __future__ import annotations

from typing import Iterable, Sequence


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
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token: int) -> None:
        """Add one accepted token (and index the n-grams that end just before it)."""
        end = len(self.tokens)          # n-grams ending at position end-1 are followed by `end`
        for n in self.lengths:
            if end >= n:
                self._index[tuple(self.tokens[end - n:end])] = end
        self.tokens.append(int(token))

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
        """``(n, drafts)``: the length of the longest suffix that occurred before and up to
        ``min(limit, max_draft)`` tokens that followed it; ``(0, [])`` when none did."""
        want = self.max_draft if limit is None else min(limit, self.max_draft)
        if want <= 0:
            return 0, []
        toks, size = self.tokens, len(self.tokens)
        for n in self.lengths:
            if size < n:
                continue
            start = self._index.get(tuple(toks[size - n:]))
            if start is not None:
                return n, toks[start:min(start + want, size)]
        return 0, []
