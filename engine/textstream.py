"""Token ids -> text pieces that are always whole UTF-8 characters, cut exactly at stop strings.

Byte-level BPE splits one Chinese character or emoji across several tokens, so decoding a
single token gives U+FFFD garbage. :class:`IncrementalDetokenizer` decodes a small window of
recent tokens and only releases text once it no longer ends in an incomplete character
(the approach vLLM and TGI use). :class:`StopMatcher` holds back any tail that could still
become a stop string, so streamed text never shows part of one. Every generation method
uses :class:`TextStream`, which combines both.

:attr:`TextStream.covered` says how many of the pushed tokens have all their text handed
out, so per-token data (log-probabilities) can travel with the piece that shows the token.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, Sequence

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Feed token ids one at a time; get back the newly completed text (possibly "")."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the window decoded for context
        self._read_offset = 0  # tokens before this are already released as text

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        before = self._decode(self._ids[self._prefix_offset:self._read_offset])
        after = self._decode(self._ids[self._prefix_offset:])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end (a truly incomplete tail comes out as U+FFFD)."""
        before = self._decode(self._ids[self._prefix_offset:self._read_offset])
        after = self._decode(self._ids[self._prefix_offset:])
        self._prefix_offset = self._read_offset = len(self._ids)
        return after[len(before):] if len(after) > len(before) else ""


class StopMatcher:
    """Finds the first stop string in the growing text and holds back possible partial matches."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str, search_from: int) -> int:
        """Index where the earliest stop string starts at or after ``search_from`` (-1 if none)."""
        start = max(0, search_from - self._longest + 1)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else -1

    def which(self, text: str, at: int) -> str:
        """The stop string found at ``at`` (the first listed, when several start there)."""
        return next(s for s in self.stops if text.startswith(s, at))

    def safe_length(self, text: str) -> int:
        """How much of ``text`` can be released: all but a tail that is a prefix of a stop."""
        for keep in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-keep:]
            if any(s.startswith(tail) for s in self.stops):
                return len(text) - keep
        return len(text)


class TextStream:
    """Detokenizer + stop strings. ``push`` returns (text to emit now, whether a stop string hit)."""

    def __init__(self, tokenizer: Any, stops: Sequence[str] = (), min_tokens: int = 0) -> None:
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stops = StopMatcher(stops)
        self._min_tokens = min_tokens  # stop strings count from the piece of this token on (vLLM's rule)
        self._pushed = 0
        self._text = ""  # everything decoded so far (up to a stop string, once one hits)
        self._emitted = 0  # characters of _text already handed out
        self._ends: list[int] = []  # per token: where its text ends in the decoded text
        self._unplaced = 0  # tokens whose text the detokenizer still holds
        self.stopped = False
        self.stop_string: str | None = None  # the stop string that ended the text, once one hit

    @property
    def covered(self) -> int:
        """Leading tokens whose text has all been handed out (every token, once stopped or finished)."""
        if self.stopped:
            return len(self._ends) + self._unplaced
        return bisect_right(self._ends, self._emitted)

    def prime(self, ids: Sequence[int], emitted_chars: int) -> None:
        """Replay tokens whose text a client already holds (``emitted_chars`` of it): the
        detokenizer and the stop matcher see them, and nothing of them is handed out again."""
        for token_id in ids:
            self.push(token_id)
        self._emitted = max(self._emitted, emitted_chars)

    def _place(self, decoded_len: int) -> None:
        """Tokens held by the detokenizer end where the text just released ends."""
        self._ends.extend([decoded_len] * self._unplaced)
        self._unplaced = 0

    @property
    def text(self) -> str:
        """The final text so far: what was emitted plus anything still held back."""
        return self._text

    def push(self, token_id: int) -> tuple[str, bool]:
        if self.stopped:
            self._unplaced += 1
            return "", True
        piece = self._detok.push(token_id)
        self._unplaced += 1
        self._pushed += 1
        if piece:
            self._place(len(self._text) + len(piece))
        return self._add(piece, final=False)

    def finish(self) -> str:
        """Release the held-back tail at the end of generation."""
        if self.stopped:
            return ""
        piece = self._detok.flush()
        self._place(len(self._text) + len(piece))
        piece, _ = self._add(piece, final=True)
        return piece

    def _add(self, piece: str, final: bool) -> tuple[str, bool]:
        if not piece and not final:
            return "", False
        searched_from = len(self._text)
        self._text += piece
        if self._stops.stops:
            hit = self._stops.find(self._text, searched_from) if self._pushed >= self._min_tokens else -1
            if hit >= 0:
                self.stop_string = self._stops.which(self._text, hit)
                self._text = self._text[:hit]
                self.stopped = True
                return self._release(len(self._text)), True
            if not final:
                return self._release(self._stops.safe_length(self._text)), False
        return self._release(len(self._text)), False

    def _release(self, upto: int) -> str:
        upto = max(upto, self._emitted)
        out = self._text[self._emitted:upto]
        self._emitted = upto
        return out
