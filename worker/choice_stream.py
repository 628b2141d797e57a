"""A job's streamed text per choice: coalesced chunks, each with the log-probabilities of
the tokens it completes.

A token event's data is ``{"text": chunk}``, plus ``"index": i`` for any choice but the
first (a job with ``n`` choices or several prompts) and ``"logprobs": [entries]`` when the
request records them (the engine hands over a token's entry before the piece that shows
it, so an entry travels with its text, or in the closing chunk for tokens that showed none,
such as a stop string's). Each choice has its own :class:`core.coalesce.TextCoalescer`.
"""
from __future__ import annotations

from typing import Any

from core.coalesce import TextCoalescer


class ChoiceStreams:
    def __init__(self, first: TextCoalescer) -> None:
        self._first = first
        self._text: dict[int, TextCoalescer] = {0: first}
        self._logprobs: dict[int, list[dict[str, Any]]] = {}

    def _coalescer(self, index: int) -> TextCoalescer:
        if index not in self._text:
            self._text[index] = TextCoalescer(self._first.interval_s, self._first.clock)
        return self._text[index]

    def add(self, index: int, text: str) -> dict[str, Any] | None:
        """The event to send now, if the choice's interval has passed."""
        chunk = self._coalescer(index).add(text)
        return self._event(index, chunk) if chunk else None

    def add_logprobs(self, index: int, entries: list[dict[str, Any]]) -> None:
        self._logprobs.setdefault(index, []).extend(entries)

    def flush(self) -> list[dict[str, Any]]:
        """Everything held, one event per choice that holds anything, in index order."""
        out = []
        for index in sorted(set(self._text) | set(self._logprobs)):
            chunk = self._coalescer(index).flush()
            if chunk or self._logprobs.get(index):
                out.append(self._event(index, chunk))
        return out

    def _event(self, index: int, chunk: str | None) -> dict[str, Any]:
        data: dict[str, Any] = {"text": chunk or ""}
        if index:
            data["index"] = index
        entries = self._logprobs.pop(index, None)
        if entries:
            data["logprobs"] = entries
        return data
