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

from typing import Any
from weakref import WeakKeyDictionary

LAYOUT = "ĠĊĉčĀ"     # byte-level BPE spellings of space, newline, tab, CR

_maps: "WeakKeyDictionary[Any, dict[int, int | None]]" = WeakKeyDictionary()


def layout_keys(vocab: dict[str, int]) -> dict[int, int | None]:
    """token id -> the key it is matched as: None for layout, the id of the token without its
    trailing layout where the vocabulary has one. Ids missing from the map match as themselves."""
    keys: dict[int, int | None] = {}
    for piece, token in vocab.items():
        stripped = piece.rstrip(LAYOUT)
        if not stripped:
            keys[token] = None
        elif stripped != piece and stripped in vocab:
            keys[token] = vocab[stripped]
    return keys


def layout_map(tokenizer: Any) -> dict[int, int | None]:
    """:func:`layout_keys` of a (byte-level BPE) tokenizer's vocabulary, built once per tokenizer."""
    try:
        return _maps[tokenizer]
    except (KeyError, TypeError):
        pass
    backend = getattr(tokenizer, "backend_tokenizer", None)      # the Rust one: ~20x faster
    keys = layout_keys(backend.get_vocab(with_added_tokens=True) if backend is not None
                       else tokenizer.get_vocab())
    try:
        _maps[tokenizer] = keys
    except TypeError:       # not weak-referenceable: rebuilt next time
        pass
    return keys
