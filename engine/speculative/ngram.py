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

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from engine.speculative.layout import Layout
from engine.speculative.restyle import Copy, Restyle


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
    tie, the exact one.

    ``follow`` (the default): while the answer keeps writing what the last copy proposed, the
    next drafts continue that copy instead of jumping to the suffix's most recent occurrence
    (a JSON array's items share their keys: ``"title": "`` last occurred in the last item); a
    copy across a new layout is drafted in the answer's own layout (:mod:`engine.speculative.
    restyle`), indentation included, so it also drafts right after a line end once the
    answer's indentation is known. ``follow=False`` is the drafter before that (the replay of
    ``bench.draft_replay`` compares the two): source tokens as they are, and no layout match
    right after a line end."""

    def __init__(self, tokens: Iterable[int], lengths: Sequence[int], max_draft: int,
                 layout: Layout | None = None, follow: bool = True) -> None:
        if not lengths or min(lengths) <= 0:
            raise ValueError("n-gram lengths must be positive")
        if max_draft <= 0:
            raise ValueError("max_draft must be positive")
        self.lengths = tuple(sorted(set(int(n) for n in lengths), reverse=True))
        self.max_draft = int(max_draft)
        self.tokens: list[int] = []
        self.layout = layout
        self.follow = follow
        self._indexes = [_KeyIndex(self.lengths, {})] + ([_KeyIndex(self.lengths, layout.keys)] if layout else [])
        self._index = self._indexes[0].index      # the exact one (tests look at its size)
        self.restyle = Restyle(layout) if layout and follow else None
        self._observing = False                   # the answer's tokens (after the prompt) teach restyle
        self._pending: _Proposal | None = None
        self._cursor: _Proposal | None = None    # the copy the answer follows (its start: where on)
        self.extend(tokens)
        self._observing = True

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def continuation(self) -> int:
        """The match length reported for a continued copy (its own acceptance estimate)."""
        return self.lengths[0] + 1

    def append(self, token: int) -> None:
        """Add one accepted token."""
        token = int(token)
        self.tokens.append(token)
        for index in self._indexes:
            index.add(token, len(self.tokens) - 1)
        if self.restyle is not None and self._observing:
            self.restyle.observe(self.tokens[-2] if len(self.tokens) > 1 else None, token)

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
        self._learn()
        if want <= 0:
            return 0, []
        proposal = self._proposal(want)
        if proposal is None:
            return 0, []
        proposal.length = len(self.tokens)
        self._pending = proposal
        return (proposal.n, proposal.copy.drafts) if proposal.copy.drafts else (0, [])

    def _proposal(self, want: int) -> "_Proposal | None":
        exact = _Proposal(*self._indexes[0].lookup(), keyed=False)
        line_end = self.layout is not None and self.tokens[-1] in self.layout.ends_line
        best = exact
        if self.layout is not None and (self.follow or not line_end):
            keyed = _Proposal(*self._indexes[1].lookup(), keyed=True)
            best = keyed if keyed.n > exact.n else exact
        if self._cursor is not None:
            best = self._cursor
            if best.rest:                             # inside a source token the answer broke
                best.copy = self._rest_of_token(best, want, line_end)
                return best
        if best.n == 0:
            return None
        best.copy = self._copy(best.start, want, best.keyed and line_end)
        if not best.copy.drafts and best.keyed and line_end and exact.n:   # indentation unknown
            best, best.copy = exact, self._copy(exact.start, want, False)
        return best

    def _rest_of_token(self, cursor: "_Proposal", want: int, line_end: bool) -> Copy:
        """Drafts after the answer wrote part of the source token at ``cursor.start``: its rest
        as the answer last wrote it (a learned split), then the copy; none if not learned."""
        split = self.restyle.splits.get(self.tokens[cursor.start]) if self.restyle else None
        if split is None or self.layout.core.get(split[1]) != cursor.rest:
            return Copy()
        return self.restyle.draft(self.tokens, cursor.start + 1, want, line_end, head=split[1])

    def _copy(self, start: int, want: int, after_line_end: bool) -> Copy:
        if self.restyle is None:
            return Copy.plain(self.tokens, start, want)
        return self.restyle.draft(self.tokens, start, want, after_line_end)

    def _learn(self) -> None:
        """Compare the last proposal with the tokens the answer wrote after it: learn its layout
        and whether it still follows the copy."""
        proposal = self._pending
        if proposal is None or len(self.tokens) <= proposal.length:
            return
        self._pending = None
        written, copy = self.tokens[proposal.length:], proposal.copy
        if self.restyle is not None:
            self.restyle.learn(copy.sources, copy.drafts, written)
        if not self.follow:
            return
        accepted = 0
        while accepted < min(len(copy.drafts), len(written)) and copy.drafts[accepted] == written[accepted]:
            accepted += 1
        start, rest = (copy.ends[accepted - 1], "") if accepted else (proposal.start, proposal.rest)
        followed = self._follow(start, written[accepted:], proposal.keyed, proposal.length, rest)
        self._cursor = None if followed is None else _Proposal(self.continuation, followed[0], proposal.keyed,
                                                               rest=followed[1])

    def _follow(self, cursor: int, written: Sequence[int], keyed: bool, end: int,
                rest: str = "") -> tuple[int, str] | None:
        """Where the copy is after the answer wrote ``written`` from ``cursor`` on: (position,
        the part of that position's token still to be written, for a copy across a new layout
        whose token the answer broke over a line end); None when the answer left the copy (wrote
        a token that is not the copy's next) or it reached ``end`` (where the answer began
        writing them). ``keyed``: compared by key, layout on either side skipped."""
        layout = self.layout if keyed else None
        for token in written:
            if layout is None:
                if cursor >= end or token != self.tokens[cursor]:
                    return None
                cursor += 1
                continue
            if layout.is_layout(token):
                if not rest and cursor < end and self.tokens[cursor] == token:
                    cursor += 1                       # the source's own layout, written as it is
                continue                              # (or the answer's own indentation)
            if not rest:
                while cursor < end and layout.is_layout(self.tokens[cursor]):
                    cursor += 1                       # the source's own layout, not written
                if cursor >= end:
                    return None
                if layout.key(token) == layout.key(self.tokens[cursor]):
                    cursor += 1
                    continue
                rest = layout.core.get(self.tokens[cursor], "")
            text = layout.core.get(token, "")
            if not text or not rest.startswith(text):
                return None
            rest = rest[len(text):]
            if not rest:
                cursor += 1
        return (cursor, rest) if cursor < end else None


@dataclass(slots=True)
class _Proposal:
    """A copy the drafter proposed (or may): where it starts, how it matched, its drafts, and
    the sequence's length when it was proposed."""

    n: int
    start: int
    keyed: bool
    copy: Copy = field(default_factory=Copy)
    length: int = 0
    rest: str = ""     # a followed copy inside its start token: the part not yet written
