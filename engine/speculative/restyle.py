"""Drafts in the answer's own layout: what a reformatting answer does to the source's layout,
learned from the answer as it goes and applied to the copied tokens.

Why: matching with layout skipped (:mod:`engine.speculative.layout`) finds where a
pretty-printed answer is in a compact source, but the source's tokens carry the source's
layout: its ``",`` is the answer's ``",\\n`` followed by an indentation token, its ``"},`` the
answer's ``"\\n``, an indentation and `` },\\n``. So every line of the answer ended in a
rejected draft, and the step after the line end drafted nothing (the indentation is not in the
source). ``python -m bench.draft_replay`` (results/draft_replay.json) replays the default
model's answers to the two JSON prompts of ``data/speculative_prompts.json`` through the
drafter: 2.46 -> 4.00 and 2.25 -> 3.77 tokens per verify step with this module and the
drafter's following of the copy (engine.speculative.ngram).

What is learned, from accepted tokens only:
- substitutions: where the answer rejected a draft ``s`` for ``t`` with the same key (the same
  token but for its trailing layout: ``",`` -> ``",\\n``), later drafts of ``s`` are ``t`` (and
  taken back if the answer later writes ``s`` where ``t`` was drafted);
- splits: where the answer broke ``s`` over a line end (``"},`` -> ``"\\n`` ... `` },\\n``: the
  texts without layout add up to ``s``'s), later drafts of ``s`` are broken the same way;
- the indentation: after a line end, the current line's (a sibling line); after a line that
  opens a block (ends in ``{ [ ( :``) the deeper one that followed an opener line indented
  like this one; for a line that starts by closing a block, its opener line's (a stack).

Text copied with its layout (code) never rejects a draft for a layout variant, so nothing is
learned there and its drafts are the source's tokens, as before.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from engine.speculative.layout import Layout

NO_INDENT = -1     # a line that starts with content (known, and nothing to draft before it)
CLOSERS = "}])"    # a line starting with one of these closes a block: indented as its opener's line


@dataclass
class Restyle:
    """One sequence's learned layout (its answer's) for restyling drafts."""

    layout: Layout
    substitutes: dict[int, int] = field(default_factory=dict)   # source token -> answer's token
    splits: dict[int, tuple[int, int]] = field(default_factory=dict)   # source -> (line end, next)
    line_indent: int | None = None                              # the current line's indentation
    deeper: dict[int, int] = field(default_factory=dict)        # an opener line's indent -> the next's
    opened: list[int | None] = field(default_factory=list)      # indents of the open blocks' lines
    _split: tuple[int, int, str] | None = None                  # (source, line end, rest) unresolved
    _line_start: bool = False

    def observe(self, previous: int | None, token: int) -> None:
        """One more accepted token of the answer (``previous``: the one before it)."""
        layout = self.layout
        if self._split is not None and not layout.is_layout(token):
            source, line_end, rest = self._split
            if layout.core.get(token) == rest:
                self.splits[source] = (line_end, token)
            self._split = None
        if self._line_start and not layout.is_layout(token):
            self._line_start = False
            if layout.core.get(token, "")[:1] in CLOSERS and self.opened:
                self.opened.pop()
        if previous is None or previous not in layout.ends_line:
            return
        indent = token if layout.is_layout(token) else NO_INDENT
        if previous in layout.opens_block and self.line_indent is not None:
            self.deeper[self.line_indent] = indent
            self.opened.append(self.line_indent)
        self.line_indent = indent
        self._line_start = layout.is_layout(token)

    def learn(self, sources: Sequence[int | None], drafts: Sequence[int], actual: Sequence[int]) -> None:
        """The answer's tokens ``actual`` after drafts restyled from ``sources``: at the first
        rejected draft, learn the layout variant the answer wrote instead (if it is one): the
        same token but for its trailing layout, or the token broken over a line end."""
        layout = self.layout
        for source, draft, token in zip(sources, drafts, actual):
            if draft == token:
                continue
            if source is None:
                return
            if token == source:                       # the answer keeps the source's layout here
                self.substitutes.pop(source, None)
                self.splits.pop(source, None)
            elif layout.key(token) == layout.key(source):
                self.substitutes[source] = token
            elif token in layout.ends_line:
                whole, head = layout.core.get(source, ""), layout.core.get(token, "")
                if whole.startswith(head) and whole != head:
                    self._split = (source, token, whole[len(head):])   # resolved by what follows
            return

    def indent_after(self, line_end: int, current: int | None) -> int | None:
        """The indentation the answer would write after ``line_end`` (NO_INDENT: none; None:
        unknown) when the line it ends is indented ``current`` (a sibling line, unless it
        opens a block)."""
        if line_end in self.layout.opens_block:
            return self.deeper.get(current) if current is not None else None
        return current

    def draft(self, tokens: Sequence[int], start: int, want: int, after_line_end: bool,
              head: int | None = None) -> Copy:
        """Up to ``want`` drafts copying ``tokens`` from ``start`` in the answer's layout.
        ``after_line_end``: the sequence's last token ended a line, so its indentation comes
        first (nothing is drafted when it is unknown). ``head``: the rest of a source token the
        answer broke over a line end, drafted first (the copy goes on from ``start``)."""
        copy, lines = Copy(), _Lines(self, self.line_indent, list(self.opened))
        following = head if head is not None else (tokens[start] if start < len(tokens) else None)
        if after_line_end and not lines.indent(tokens[-1], following, copy, start):
            return Copy()
        at = start
        if after_line_end:
            while at < len(tokens) and self.layout.is_layout(tokens[at]):
                at += 1                                   # the source's own indentation: replaced
        if head is not None:
            copy.add(head, None, at)
        while len(copy.drafts) < want and at < len(tokens):
            source = tokens[at]
            at += 1
            split = self.splits.get(source)
            draft = split[0] if split else self.substitutes.get(source, source)
            if draft != source and draft in self.layout.ends_line:    # a line end the source lacks
                if at < len(tokens) and self.layout.is_layout(tokens[at]):
                    at += 1                                           # (the source's own layout)
                copy.add(draft, source, at)
                following = split[1] if split else (tokens[at] if at < len(tokens) else None)
                if not lines.indent(draft, following, copy, at):
                    break
                if split:
                    copy.add(split[1], None, at)
            else:
                copy.add(draft, source, at)
        return copy.cut(want)


@dataclass
class _Lines:
    """The indentation state while a draft runs on over line ends."""

    restyle: Restyle
    current: int | None
    opened: list[int | None]

    def indent(self, line_end: int, following: int | None, copy: "Copy", at: int) -> bool:
        """Add the indentation of the line after ``line_end`` (which starts with ``following``);
        False when it is unknown. (The answer's own state counts a block as open from the token
        after its opener line's end on, so an opener is pushed here whether drafted or written.)"""
        layout = self.restyle.layout
        if line_end in layout.opens_block:
            indent = self.restyle.indent_after(line_end, self.current)
            self.opened.append(self.current)
        elif following is not None and layout.core.get(following, "")[:1] in CLOSERS:
            indent = self.opened.pop() if self.opened else None
        else:
            indent = self.current
        if indent is None:
            return False
        if indent != NO_INDENT:
            copy.add(indent, None, at)
        self.current = indent
        return True


@dataclass
class Copy:
    """Drafts copied from the context: each draft, the context token it copies (None for an
    inserted indentation) and the context position just after it (where the copy goes on)."""

    drafts: list[int] = field(default_factory=list)
    sources: list[int | None] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    def add(self, draft: int, source: int | None, end: int) -> None:
        self.drafts.append(draft)
        self.sources.append(source)
        self.ends.append(end)

    def cut(self, want: int) -> "Copy":
        return Copy(self.drafts[:want], self.sources[:want], self.ends[:want])

    @classmethod
    def plain(cls, tokens: Sequence[int], start: int, want: int) -> "Copy":
        """The tokens from ``start`` as they are."""
        end = min(start + want, len(tokens))
        return cls(list(tokens[start:end]), list(tokens[start:end]), list(range(start + 1, end + 1)))
