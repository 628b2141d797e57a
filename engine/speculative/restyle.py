"""Drafts in the answer's own layout: what a reformatting answer does to the source's layout,
learned from the answer as it goes and applied to the copied tokens.

Why: matching with layout skipped (:mod:`engine.speculative.layout`) finds where a
pretty-printed answer is in a compact source, but the source's tokens carry the source's
layout: its ``",`` is the answer's ``",\\n`` followed by an indentation token. So every line
of the answer ended in a rejected draft, and the step after the line end drafted nothing (the
indentation is not in the source): about three verify steps a line instead of one. Replaying
the default model's answers to the two JSON prompts of ``data/speculative_prompts.json``
through the drafter (k = 8, every draft checked against the answer): 2.46 -> 2.98 and 2.25 ->
2.67 tokens per verify step.

What is learned, from accepted tokens only:
- substitutions: where the answer rejected a draft ``s`` for ``t`` with the same key (the same
  token but for its trailing layout: ``",`` -> ``",\\n``), later drafts of ``s`` are ``t`` (and
  taken back if the answer later writes ``s`` where ``t`` was drafted);
- the indentation: after a line end, the current line's indentation (the answer's most recent
  line's), or after a line that opens a block (ends in ``{ [ ( :``) what followed the same
  token last time.

Text copied with its layout (code) never rejects a draft for a layout variant, so nothing is
learned there and its drafts are the source's tokens, as before.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from engine.speculative.layout import Layout

NO_INDENT = -1     # a line that starts with content (known, and nothing to draft before it)


@dataclass
class Restyle:
    """One sequence's learned layout (its answer's) for restyling drafts."""

    layout: Layout
    substitutes: dict[int, int] = field(default_factory=dict)   # source token -> answer's token
    line_indent: int | None = None                              # the current line's indentation
    after_opener: dict[int, int] = field(default_factory=dict)  # block-opening line end -> indent

    def observe(self, previous: int | None, token: int) -> None:
        """One more accepted token of the answer (``previous``: the one before it)."""
        if previous is None or previous not in self.layout.ends_line:
            return
        indent = token if self.layout.is_layout(token) else NO_INDENT
        self.line_indent = indent
        if previous in self.layout.opens_block:
            self.after_opener[previous] = indent

    def learn(self, sources: Sequence[int | None], drafts: Sequence[int], actual: Sequence[int]) -> None:
        """The answer's tokens ``actual`` after drafts restyled from ``sources``: at the first
        rejected draft, learn the layout variant the answer wrote instead (if it is one)."""
        for source, draft, token in zip(sources, drafts, actual):
            if draft == token:
                continue
            if source is not None and self.layout.key(token) == self.layout.key(source):
                if token == source:
                    self.substitutes.pop(source, None)
                else:
                    self.substitutes[source] = token
            return

    def indent_after(self, line_end: int, current: int | None) -> int | None:
        """The indentation the answer would write after ``line_end`` (NO_INDENT: none; None:
        unknown) when the line it ends is indented ``current``."""
        if line_end in self.layout.opens_block:
            return self.after_opener.get(line_end)
        return current

    def draft(self, tokens: Sequence[int], start: int, want: int, after_line_end: bool) -> Copy:
        """Up to ``want`` drafts copying ``tokens`` from ``start`` in the answer's layout.
        ``after_line_end``: the sequence's last token ended a line, so its indentation comes
        first (nothing is drafted when it is unknown)."""
        copy = Copy()
        current = self.line_indent
        if after_line_end and self._indent(tokens[-1], current, copy, start) is None:
            return Copy()
        at = start
        while len(copy.drafts) < want and at < len(tokens):
            source = tokens[at]
            at += 1
            draft = self.substitutes.get(source, source)
            if draft != source and draft in self.layout.ends_line:    # a line end the source lacks
                if at < len(tokens) and self.layout.is_layout(tokens[at]):
                    at += 1                                           # (the source's own layout)
                copy.add(draft, source, at)
                current = self._indent(draft, current, copy, at)
                if current is None:
                    break
            else:
                copy.add(draft, source, at)
        return copy.cut(want)

    def _indent(self, line_end: int, current: int | None, copy: "Copy", at: int) -> int | None:
        """Add the indentation after ``line_end`` (nothing for NO_INDENT) and return it;
        None (nothing added) when it is unknown."""
        indent = self.indent_after(line_end, current)
        if indent is not None and indent != NO_INDENT:
            copy.add(indent, None, at)
        return indent


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
