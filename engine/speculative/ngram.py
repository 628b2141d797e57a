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

from typing import Iterable, Mapping, Sequence

from engine.speculative.layout import Layout


class _KeyIndex:
    """One way of matching: n-grams of *keys* (the tokens as ``canon`` reads them; None for a
    token that is skipped) -> the position in the token list just after their most recent
    occurrence. Indexed one key late, so the current suffix never finds itself."""

    def __init__(self, lengths: tuple[int, ...], canon: Mapping[int, int | None]) -> None:
        self.lengths, self.canon = lengths, canon
        self.keys: list[int] = []
        self.key_pos: list[int] = []      # where each key is in the token list
        self.index: dict[tuple[int, ...], int] = {}

    def add(self, token: int, position: int) -> None:
        key = self.canon.get(token, token)
        if key is None:
            return
        keys, end = self.keys, len(self.keys)
        for n in self.lengths:            # the n-grams ending at the previous key
            if end >= n:
                self.index[tuple(keys[end - n:end])] = self.key_pos[end - 1] + 1
        keys.append(key)
        self.key_pos.append(position)

    def lookup(self) -> tuple[int, int]:
        """(n, start) of the longest key suffix seen before; (0, -1) when none was."""
        keys = self.keys
        for n in self.lengths:
            if len(keys) >= n:
                start = self.index.get(tuple(keys[len(keys) - n:]))
                if start is not None:
                    return n, start
        return 0, -1


class NgramDrafter:
    """Per-sequence n-gram index over prompt + accepted tokens (rejected drafts never enter).

    Matched two ways: token for token, and (with ``layout``, :mod:`engine.speculative.layout`)
    with whitespace skipped, for text copied under a new layout. The longer match wins; on a
    tie, the exact one. A layout match does not draft right after a line end (the next
    line's indentation is not in the source)."""

    def __init__(self, tokens: Iterable[int], lengths: Sequence[int], max_draft: int,
                 layout: Layout | None = None) -> None:
        if not lengths or min(lengths) <= 0:
            raise ValueError("n-gram lengths must be positive")
        if max_draft <= 0:
            raise ValueError("max_draft must be positive")
        self.lengths = tuple(sorted(set(int(n) for n in lengths), reverse=True))
        self.max_draft = int(max_draft)
        self.tokens: list[int] = []
        self.layout = layout
        self._indexes = [_KeyIndex(self.lengths, {})] + ([_KeyIndex(self.lengths, layout.keys)] if layout else [])
        self._index = self._indexes[0].index      # the exact one (tests look at its size)
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token: int) -> None:
        """Add one accepted token."""
        token = int(token)
        self.tokens.append(token)
        for index in self._indexes:
            index.add(token, len(self.tokens) - 1)

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
        n, start = self._indexes[0].lookup()
        if self.layout is not None and self.tokens[-1] not in self.layout.ends_line:
            keyed_n, keyed_start = self._indexes[1].lookup()
            if keyed_n > n:
                n, start = keyed_n, keyed_start
        if n == 0:
            return 0, []
        return n, self.tokens[start:min(start + want, len(self.tokens))]
