"""A streamed ``/v1/responses`` answer: the Responses event types, numbered by ``sequence_number``.

``response.created`` and ``response.in_progress`` first; then, as tokens come, an output item
is opened (``response.output_item.added``) and filled: an assistant message
(``response.content_part.added``, ``response.output_text.delta``) or, when the grammar holds
the answer to calls (forced calls, an ``auto`` answer that opens with one), a
``function_call`` (``response.function_call_arguments.delta``). An ``auto`` answer that does
not open with a call is held back to the end, as for chat (keep-alive comments go out
meanwhile). At the job's end every item is closed with its final value (``...done`` events,
``response.output_item.done``) and ``response.completed`` (``response.incomplete`` when
``max_output_tokens`` cut it, ``response.failed`` when the job did not succeed) carries the
whole Response, whose ``output`` is the items as the events described them.
"""
from __future__ import annotations

import json
from typing import Any, Iterator

from core.events import DONE
from core.jobs import JobRecord, JobStore
from web.openai.call_stream import ToolStream
from web.openai.convert import ChatJob
from web.openai.responses_shape import (
    answer_of, call_item, message_item, output_items, response_object, status_of, text_part,
)
from web.openai.follow import KEEPALIVE, follow_job

CLOSING_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete"}


class ResponseEvents:
    """The events of one streamed response, in order, with their sequence numbers."""

    def __init__(self, job: JobRecord, chat: ChatJob, model: str) -> None:
        self.job, self.model = job, model
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # opened items, as streamed so far
        self.call_at: dict[int, int] = {}      # streamed call index -> its output_index
        self.calls = ToolStream(job.id, chat.forced_calls, chat.tools.names) if chat.tools is not None else None

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def start(self) -> list[str]:
        response = response_object(self.job, self.model, output=[], status="in_progress")
        return [self.event("response.created", response=response),
                self.event("response.in_progress", response=response)]

    def token(self, text: str) -> list[str]:
        if self.calls is None:
            return self._text(text)
        out = []
        for delta in self.calls.feed(text):
            out += self._call_delta(delta)
        return out or [KEEPALIVE]

    def _open(self, item: dict[str, Any]) -> tuple[int, list[str]]:
        self.items.append(item)
        index = len(self.items) - 1
        added = self.event("response.output_item.added", output_index=index, item=item)
        return index, [added]

    def _text(self, text: str) -> list[str]:
        out: list[str] = []
        if not self.items:
            index, out = self._open(message_item(self.job.id, None, "in_progress"))
            self.items[index]["content"] = [text_part("")]
            out.append(self.event("response.content_part.added", item_id=self.items[index]["id"],
                                  output_index=index, content_index=0, part=text_part("")))
        item = self.items[0]
        item["content"][0]["text"] += text
        return out + [self.event("response.output_text.delta", item_id=item["id"], output_index=0,
                                 content_index=0, delta=text, logprobs=[])]

    def _call_delta(self, delta: dict[str, Any]) -> list[str]:
        out: list[str] = []
        function = delta["function"]
        if "id" in delta:
            self.call_at[delta["index"]], out = self._open(
                call_item(self.job.id, delta["index"], function["name"], "", "in_progress"))
        index = self.call_at[delta["index"]]
        if function["arguments"]:
            self.items[index]["arguments"] += function["arguments"]
            out.append(self.event("response.function_call_arguments.delta", item_id=self.items[index]["id"],
                                  output_index=index, delta=function["arguments"]))
        return out

    def finish(self, job: JobRecord) -> list[str]:
        """Close every item with the final answer's value, then the closing event."""
        answer = answer_of(job)
        status = status_of(job, answer)
        final = output_items(job, answer, status)
        streamed = {item["id"] for item in self.items}
        out: list[str] = []
        for index, item in enumerate(list(self.items)):
            out += self._close(index, item, next((f for f in final if f["id"] == item["id"]), None))
        for item in final:
            if item["id"] not in streamed:
                index, added = self._open(_skeleton(item))
                out += added + self._fill(index, item) + self._close(index, self.items[index], item)
        closing = response_object(job, self.model, output=self.items, status=status)
        return out + [self.event(CLOSING_EVENT[status], response=closing)]

    def _fill(self, index: int, item: dict[str, Any]) -> list[str]:
        """The value of an item that was not streamed, as one delta."""
        if item["type"] == "message":
            part = text_part("")
            self.items[index]["content"] = [part]
            return [self.event("response.content_part.added", item_id=item["id"], output_index=index,
                               content_index=0, part=part),
                    self.event("response.output_text.delta", item_id=item["id"], output_index=index,
                               content_index=0, delta=item["content"][0]["text"], logprobs=[])]
        return [self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                           delta=item["arguments"])]

    def _close(self, index: int, opened: dict[str, Any], final: dict[str, Any] | None) -> list[str]:
        """``...done`` events with the final value (a streamed call the answer did not keep
        closes as it was streamed, ``incomplete``)."""
        closed = dict(final) if final is not None else {**opened, "status": "incomplete"}
        self.items[index] = closed
        out = []
        if closed["type"] == "message":
            part = closed["content"][0]
            out += [self.event("response.output_text.done", item_id=closed["id"], output_index=index,
                               content_index=0, text=part["text"], logprobs=[]),
                    self.event("response.content_part.done", item_id=closed["id"], output_index=index,
                               content_index=0, part=part)]
        else:
            out.append(self.event("response.function_call_arguments.done", item_id=closed["id"],
                                  output_index=index, name=closed["name"], arguments=closed["arguments"]))
        return out + [self.event("response.output_item.done", output_index=index, item=closed)]

    def failed(self, job: JobRecord) -> list[str]:
        return [self.event("response.failed", response=response_object(job, self.model, output=self.items))]


def _skeleton(item: dict[str, Any]) -> dict[str, Any]:
    """An item as ``response.output_item.added`` shows it: in progress, nothing in it yet."""
    empty = {"content": []} if item["type"] == "message" else {"arguments": ""}
    return {**item, "status": "in_progress", **empty}


def stream_response(store: JobStore, celery: Any, job: JobRecord, chat: ChatJob, model: str) -> Iterator[str]:
    """The job's events as Responses events (:func:`web.openai.follow.follow_job`: keep-alives,
    the terminal event, the job cancelled when the client leaves early)."""
    events = ResponseEvents(job, chat, model)

    def ending(event_type: str, _payload: dict[str, Any]) -> Iterator[str]:
        record = store.get(job.id)
        return iter(events.finish(record) if event_type == DONE else events.failed(record))

    def token(data: dict[str, Any]) -> Iterator[str]:
        return iter(events.token(data.get("text", "")))

    def error(_type: str, _message: str, _code: str) -> str:
        return "".join(events.failed(store.get(job.id)))

    return follow_job(store, celery, job, events.start(), token, ending, error)
