"""Tool-call deltas while the answer is generated, for grammar-held calls.

With ``tool_choice: required`` or a named function, the grammar (:mod:`core.grammar`) makes
the answer exactly ``{"name": "NAME", "arguments": ARGS}`` calls, one a line; with ``auto``
an answer that opens with such a head (JSON spacing before the name allowed) is held to the
same from there on. So the stream can be cut as it comes: the first delta of a call carries its index, id, type and name
(``arguments: ""``), the next ones the argument text piece by piece, as OpenAI streams them;
the wrapper's closing brace and the newline are not part of the arguments (an argument
object ends where its brace depth returns to zero, strings and escapes taken into account).
"""
from __future__ import annotations

import re
from typing import Any, Iterable

JSON_WS = " \t\r\n"
HEAD_RE = re.compile(r'\{[ \t\r\n]*"name"[ \t\r\n]*:[ \t\r\n]*"([^"\\]*)", "arguments": ')


def call_id(job_id: str, index: int) -> str:
    """The same id ``tool_calls.openai_tool_calls`` gives the call in the final answer."""
    return f"call_{job_id[:20]}_{index}"


class CallStreamer:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.text = ""
        self.pos = 0          # next unread character
        self.index = -1       # current call
        self.in_args = False
        self.depth = 0
        self.in_string = self.escaped = False

    def feed(self, piece: str) -> list[dict[str, Any]]:
        """The ``tool_calls`` delta entries this piece of text completes."""
        self.text += piece
        out: list[dict[str, Any]] = []
        while True:
            if self.in_args:
                chunk = self._read_args()
                if chunk:
                    out.append({"index": self.index, "function": {"arguments": chunk}})
                if self.in_args:
                    return out
            elif not self._read_head(out):
                return out

    def _read_head(self, out: list[dict[str, Any]]) -> bool:
        found = HEAD_RE.search(self.text, self.pos)
        if found is None:
            return False
        self.index += 1
        out.append({"index": self.index, "id": call_id(self.job_id, self.index), "type": "function",
                    "function": {"name": found.group(1), "arguments": ""}})
        self.pos = found.end()
        self.in_args, self.depth = True, 0
        return True

    def _read_args(self) -> str:
        begin = self.pos
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            self.pos += 1
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.in_args = False
                    break
        return self.text[begin:self.pos]


def head_state(text: str, names: Iterable[str]) -> str:
    """Whether ``text`` (leading blanks stripped) opens a call under the name rule of
    :func:`core.grammar.call_trigger`: ``"call"`` once ``{"name": "F"`` names a declared
    ``F``, ``"maybe"`` while it is still a prefix of one, ``"no"`` as soon as it is not."""
    pos = 0
    for literal in ("{", '"name"', ":", '"'):
        while pos < len(text) and literal != "{" and text[pos] in JSON_WS:
            pos += 1
        piece = text[pos:pos + len(literal)]
        if piece != literal[:len(piece)]:
            return "no"
        if len(piece) < len(literal):
            return "maybe"
        pos += len(literal)
    rest = text[pos:]
    quoted = [name + '"' for name in names]
    if any(rest.startswith(q) for q in quoted):
        return "call"
    return "maybe" if any(q.startswith(rest) for q in quoted) else "no"


class ToolStream:
    """One streamed answer of a request with tools: which text becomes ``tool_calls`` deltas.

    Forced calls: all of it. ``auto``: decided on the answer's head: one that opens with a
    call of a declared tool (:func:`head_state`; the lazy grammar holds it to valid calls
    from there) streams as deltas; any other answer, JSON answers included, is held back to
    the end, as a call may still start later in it."""

    def __init__(self, job_id: str, forced: bool, names: Iterable[str] = ()) -> None:
        self.calls = CallStreamer(job_id)
        self.mode = "calls" if forced else "undecided"
        self.names = list(names)
        self._head = ""

    @property
    def streamed(self) -> bool:
        """Whether any call went out as deltas (the ending then does not repeat them)."""
        return self.calls.index >= 0

    def feed(self, piece: str) -> list[dict[str, Any]]:
        if self.mode == "undecided":
            self._head += piece
            state = head_state(self._head.lstrip(), self.names)
            if state == "maybe":
                return []
            self.mode = "calls" if state == "call" else "held"
            piece = self._head
        return self.calls.feed(piece) if self.mode == "calls" else []
