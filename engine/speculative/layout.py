"""Matching drafts across a change of layout: whitespace is not matched on.

Why: a reformatting job copies the content and changes the layout. In the prompt
``{"name": "Alice", "email": ...}`` the token after ``"Alice`` is ``",`` and then `` "``; in
the pretty-printed answer it is ``",\\n``, an indentation token, then `` "``. Matched token
for token, the n-gram index loses the thread at every line end and proposes the previous
line's key (the most recent match of the indentation). Matched on *keys* instead -- layout
tokens (only spaces, newlines, tabs) skipped, a token ending in layout read as the token
without it (``",\\n`` as ``",``) -- the suffix ``Alice", "`` finds the prompt's position
and the drafts continue with ``email": "...``. Drafts are still the original tokens, so the
model decides, and nothing changes for text whose layout is copied as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from weakref import WeakKeyDictionary

LAYOUT = "ĠĊĉčĀ"     # byte-level BPE spellings of space, newline, tab, CR
NEWLINE = "Ċ"
OPENERS = "{[(:"    # a line ending in one of these opens a block: the next line is indented deeper


@dataclass(frozen=True, eq=False)
class Layout:
    """How a vocabulary's tokens are matched when layout is ignored.

    ``keys``: token -> the key it is matched as (None: skipped; absent: itself).
    ``ends_line``: tokens ending in a newline -- what follows is the next line's indentation,
    which the source (laid out differently) cannot predict, so the layout index does not
    draft right after one (replaying the JSON answers: as many steps, 30% fewer drafts)."""

    keys: dict[int, int | None]
    ends_line: frozenset[int]
    opens_block: frozenset[int] = frozenset()   # line ends after an opener ({ [ ( :): deeper next
    core: dict[int, str] = field(default_factory=dict)   # token -> its text without layout at either end

    def key(self, token: int) -> int | None:
        return self.keys.get(token, token)

    def is_layout(self, token: int) -> bool:
        """Only spaces, newlines, tabs (an indentation token)."""
        return token in self.keys and self.keys[token] is None


_maps: "WeakKeyDictionary[Any, Layout]" = WeakKeyDictionary()


def layout_keys(vocab: dict[str, int]) -> Layout:
    """The :class:`Layout` of a byte-level BPE vocabulary (piece -> id)."""
    keys: dict[int, int | None] = {}
    core: dict[int, str] = {}
    ends_line, opens_block = set(), set()
    for piece, token in vocab.items():
        stripped = piece.rstrip(LAYOUT)
        core[token] = stripped.lstrip(LAYOUT)
        if NEWLINE in piece[len(stripped):]:
            ends_line.add(token)
            if stripped[-1:] in OPENERS:
                opens_block.add(token)
        if not stripped:
            keys[token] = None
        elif stripped != piece and stripped in vocab:
            keys[token] = vocab[stripped]
    return Layout(keys=keys, ends_line=frozenset(ends_line), opens_block=frozenset(opens_block), core=core)


def layout_map(tokenizer: Any) -> Layout:
    """:func:`layout_keys` of a tokenizer's vocabulary, built once per tokenizer (~1.3 s)."""
    try:
        return _maps[tokenizer]
    except (KeyError, TypeError):
        pass
    layout = layout_keys(tokenizer.get_vocab())
    try:
        _maps[tokenizer] = layout
    except TypeError:       # not weak-referenceable: rebuilt next time
        pass
    return layout
