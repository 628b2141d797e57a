"""Tool-call deltas while the answer is generated, for grammar-forced calls.

With ``tool_choice: required`` or a named function, the grammar (:mod:`core.grammar`) makes
the answer exactly ``{"name": "NAME", "arguments": ARGS}`` calls, one a line. So the stream
can be cut as it comes: the first delta of a call carries its index, id, type and name
(``arguments: ""``), the next ones the argument text piece by piece, as OpenAI streams them;
the wrapper's closing brace and the newline are not part of the arguments (an argument
object ends where its brace depth returns to zero, strings and escapes taken into account).
"""
from __future__ import annotations

from typing import Any

HEAD = '{"name": "'
ARGS_KEY = '", "arguments": '


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
        rest = self.text[self.pos:]
        start = rest.find(HEAD)
        if start == -1:
            return False
        name_at = start + len(HEAD)
        end = rest.find(ARGS_KEY, name_at)
        if end == -1:
            return False
        self.index += 1
        out.append({"index": self.index, "id": call_id(self.job_id, self.index), "type": "function",
                    "function": {"name": rest[name_at:end], "arguments": ""}})
        self.pos += end + len(ARGS_KEY)
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


class ToolStream:
    """One streamed answer of a request with tools: which text becomes ``tool_calls`` deltas.

    Forced calls: all of it. ``auto``: decided at the first non-blank character; an answer
    that opens with ``{`` is a bare-JSON call (the lazy grammar holds it to valid calls from
    that token on), so it streams as deltas; any other answer is held back to the end, as a
    call may still start later in it."""

    def __init__(self, job_id: str, forced: bool) -> None:
        self.calls = CallStreamer(job_id)
        self.mode = "calls" if forced else "undecided"
        self._head = ""

    @property
    def streamed(self) -> bool:
        """Whether any call went out as deltas (the ending then does not repeat them)."""
        return self.calls.index >= 0

    def feed(self, piece: str) -> list[dict[str, Any]]:
        if self.mode == "undecided":
            self._head += piece
            body = self._head.lstrip()
            if not body:
                return []
            self.mode = "calls" if body.startswith("{") else "held"
            piece = self._head
        return self.calls.feed(piece) if self.mode == "calls" else []
