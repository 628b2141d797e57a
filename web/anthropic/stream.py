"""A streamed ``/v1/messages`` answer in Anthropic's event sequence.

``message_start`` (the message with no content and zero usage) and a ``ping``; then, as
tokens come, content blocks: a ``text`` block (``content_block_start``, ``text_delta``s) or,
when the grammar holds the answer to calls (``tool_choice`` ``any`` or ``tool``, an ``auto``
answer that opens with a call), one ``tool_use`` block per call (``input_json_delta``s, the
input object's JSON text piece by piece, :class:`web.openai.call_stream.ToolStream`). An
``auto`` answer that does not open with a call is held back to the end, as for chat
(keep-alive comments go out meanwhile), then sent as whole blocks. Each block is closed
(``content_block_stop``) before the next opens. At the job's end: ``message_delta`` with
``stop_reason``, ``stop_sequence`` and the usage (input counts included: they are known only
then), and ``message_stop``. A job that fails, is cancelled or times out ends the stream with
an ``error`` event in Anthropic's error shape.
"""
from __future__ import annotations

import json
from typing import Any, Iterator

from core.events import DONE, TIMEOUT
from core.jobs import JobRecord, JobStore
from web.anthropic.errors import error_body
from web.anthropic.shape import (
    answer_of, content_blocks, message, stop_of, text_block, tool_use_block, usage,
)
from web.openai.call_stream import ToolStream
from web.openai.convert import ChatJob
from web.openai.follow import KEEPALIVE, follow_job


class MessageEvents:
    """The events of one streamed message, in order; ``blocks`` are the content blocks opened."""

    def __init__(self, job: JobRecord, chat: ChatJob, model: str) -> None:
        self.job, self.chat, self.model = job, chat, model
        self.blocks: list[dict[str, Any]] = []
        self.open: int | None = None  # the index of the block not yet stopped
        self.calls = ToolStream(job.id, chat.forced_calls, chat.tools.names) if chat.tools is not None else None

    @staticmethod
    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"

    def start(self) -> list[str]:
        return [self.event("message_start", message=message(self.job, self.chat, self.model)), self.event("ping")]

    def token(self, text: str) -> list[str]:
        if self.calls is None:
            return self._text(text) if text else []
        out: list[str] = []
        for delta in self.calls.feed(text):
            out += self._call_delta(delta)
        return out or [KEEPALIVE]

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        index, self.open = self.open, None
        return [self.event("content_block_stop", index=index)]

    def _start_block(self, block: dict[str, Any]) -> list[str]:
        out = self._close()
        self.blocks.append(block)
        self.open = len(self.blocks) - 1
        return out + [self.event("content_block_start", index=self.open, content_block=block)]

    def _delta(self, delta: dict[str, Any]) -> str:
        return self.event("content_block_delta", index=self.open, delta=delta)

    def _text(self, text: str) -> list[str]:
        out = [] if self.open is not None and self.blocks[self.open]["type"] == "text" else \
            self._start_block(text_block(""))
        return out + [self._delta({"type": "text_delta", "text": text})]

    def _call_delta(self, delta: dict[str, Any]) -> list[str]:
        function = delta["function"]
        out = self._start_block(tool_use_block(self.job.id, delta["index"], function["name"], {})) \
            if "id" in delta else []
        if function["arguments"]:
            out.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
        return out

    def _whole(self, block: dict[str, Any]) -> list[str]:
        """A block that was not streamed, opened empty and filled by one delta."""
        if block["type"] == "text":
            return self._start_block(text_block("")) + [self._delta({"type": "text_delta", "text": block["text"]})]
        out = self._start_block({**block, "input": {}})
        return out + [self._delta({"type": "input_json_delta",
                                   "partial_json": json.dumps(block["input"], ensure_ascii=False)})]

    def finish(self, result: dict[str, Any]) -> list[str]:
        """What was held back, the last ``content_block_stop``, ``message_delta``, ``message_stop``.
        Calls that went out as they were generated are not repeated; text the answer holds
        beside them follows them."""
        answer = answer_of(self.chat, result)
        out: list[str] = []
        if not self.blocks:
            for block in content_blocks(self.job.id, answer):
                out += self._whole(block)
        elif answer.calls and answer.content and all(b["type"] == "tool_use" for b in self.blocks):
            out += self._whole(text_block(answer.content))
        out += self._close()
        stop_reason, stop_sequence = stop_of(answer, result)
        out.append(self.event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                              usage=usage(result)))
        return out + [self.event("message_stop")]

    def failed(self, error_type: str, text: str) -> str:
        return f"event: error\ndata: {json.dumps(error_body(error_type, text), ensure_ascii=False)}\n\n"


def stream_message(store: JobStore, celery: Any, job: JobRecord, chat: ChatJob, model: str) -> Iterator[str]:
    """The job's events as Anthropic events (:func:`web.openai.follow.follow_job`: keep-alives,
    the terminal event, the job cancelled when the client leaves early)."""
    events = MessageEvents(job, chat, model)

    def token(data: dict[str, Any]) -> Iterator[str]:
        return iter(events.token(data.get("text", "")))

    def ending(event_type: str, payload: dict[str, Any]) -> Iterator[str]:
        if event_type == DONE:
            return iter(events.finish(payload))
        text = str(payload.get("message") or payload.get("reason") or event_type)
        return iter([events.failed("timeout_error" if event_type == TIMEOUT else "api_error", text)])

    def error(_type: str, text: str, _code: str) -> str:
        return events.failed("api_error", text)

    return follow_job(store, celery, job, events.start(), token, ending, error)
