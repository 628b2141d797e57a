"""A ``/v1/responses`` request as the same ``chat`` job ``/v1/chat/completions`` makes.

The Responses body is rewritten as a chat body (``instructions`` -> a first system message,
``previous_response_id`` -> that response's conversation and answer, input items -> chat
messages, ``max_output_tokens`` -> ``max_completion_tokens``, ``text.format`` ->
``response_format``, flat function tools -> chat tools) and goes through the chat path
(:func:`web.openai.convert.chat_job`): one set of checks, grammars and job shape. Errors that
path raises name the chat field; they are renamed to the Responses field here. The job's
stored request carries ``"response"``: what the answer echoes and what a later
``previous_response_id`` or ``GET /v1/responses/{id}`` needs, so the response *is* its job.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from core.events import SUCCEEDED
from web.errors import ApiError
from web.openai.convert import ChatJob, chat_job_of
from web.openai.responses_schemas import (
    ContentPart, FunctionCallItem, FunctionCallOutputItem, MessageItem, ResponseRequest,
)
from web.openai.responses_shape import RESPONSE_PREFIX, assistant_turn, stored_response
from web.sampling_base import SHARED_FIELDS

RENAMES = (("max_completion_tokens", "max_output_tokens"), ("response_format.json_schema", "text.format"),
           ("response_format", "text.format"))
_CHAT_TOOL_FIELD = re.compile(r"^tools\.(\d+)\.function(\.|$)")


@dataclass(frozen=True)
class ResponseJob:
    chat: ChatJob
    meta: dict[str, Any]  # stored as the job request's "response"


def _text(content: str | list[ContentPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def input_messages(items: str | list[Any]) -> list[dict[str, Any]]:
    """Input items as chat messages; function calls join the assistant turn just before them
    (the text and calls of one answer, as a client echoes its output back), or open one."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "content": _text(item.output), "tool_call_id": item.call_id})
    return out


def _as_request_message(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored chat message (arguments as objects) back in the request shape (JSON text)."""
    out = dict(stored)
    if out.get("tool_calls"):
        out["tool_calls"] = [{**call, "function": {**call["function"], "arguments": _json_text(
            call["function"]["arguments"])}} for call in out["tool_calls"]]
    return out


def _json_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def previous_conversation(response_id: str, find: Any) -> list[dict[str, Any]]:
    """The conversation of a stored, completed response (its instructions left out, as
    OpenAI does) and its answer, as chat messages. ``find``: job id -> record (owner-checked)."""
    job = stored_response(response_id, find, "previous_response_id")
    if job.state != SUCCEEDED:
        raise ApiError(400, "previous_response_not_completed", f"previous_response_id: the response "
                       f"{response_id!r} is {job.state}, not completed", field="previous_response_id")
    start, end = job.request["response"]["conversation"]
    history = [_as_request_message(m) for m in job.request["messages"][start:end]]
    return history + [_as_request_message(assistant_turn(job))]


def _format(body: ResponseRequest) -> dict[str, Any] | None:
    found = body.text.format if body.text is not None else None
    if found is None or found.type != "json_schema":
        return {"type": found.type} if found is not None else None
    spec = {"name": found.name, "schema": found.json_schema, "description": found.description,
            "strict": found.strict}
    return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if v is not None}}


def _tool_choice(body: ResponseRequest) -> Any:
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice.name}}


def chat_body(body: ResponseRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    tools = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
             for t in body.tools] if body.tools is not None else None
    fields = {"messages": messages, "model": body.model, "stream": bool(body.stream),
              "max_completion_tokens": body.max_output_tokens, "tools": tools, "tool_choice": _tool_choice(body),
              "parallel_tool_calls": body.parallel_tool_calls, "response_format": _format(body),
              **{name: getattr(body, name) for name in SHARED_FIELDS}}  # the shared base, as it is
    return {k: v for k, v in fields.items() if v is not None}


def renamed(field: str | None) -> str | None:
    """A chat body's field name as the Responses body spells it (a message's index counts the
    instructions and the previous turns too, so ``messages.N`` is just ``input``)."""
    if field is None:
        return None
    if field == "messages" or field.startswith("messages."):
        return "input"
    field = _CHAT_TOOL_FIELD.sub(lambda m: f"tools.{m.group(1)}{m.group(2)}", field)
    for old, new in RENAMES:
        if field == old or field.startswith(old + "."):
            return new + field[len(old):]
    return field


def _meta(body: ResponseRequest, conversation: tuple[int, int]) -> dict[str, Any]:
    """What the answer echoes and a later turn reads (``conversation``: the stored messages
    after the instructions and before any hint the chat path appends)."""
    choice = body.tool_choice
    text_format = body.text.format if body.text is not None else None
    return {"instructions": body.instructions, "previous_response_id": body.previous_response_id,
            "store": body.store is not False, "background": bool(body.background),
            "conversation": list(conversation),
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
            "tool_choice": choice.model_dump() if isinstance(choice, BaseModel) else choice,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "text": {"format": text_format.model_dump(by_alias=True, exclude_none=True) if text_format
                     else {"type": "text"}},
            "max_output_tokens": body.max_output_tokens}


def response_job(body: ResponseRequest, find: Any) -> ResponseJob:
    """Validate and build the job; ``find`` looks up a previous response's job (owner-checked)."""
    if body.background and body.store is False:
        raise ApiError(422, "validation_error", "background: needs store (a background response is read "
                       "back with GET /v1/responses/{id})", field="background")
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    history = previous_conversation(body.previous_response_id, find) if body.previous_response_id else []
    conversation = history + input_messages(body.input)
    chat = chat_job_of(chat_body(body, system + conversation), renamed)
    meta = _meta(body, (len(system), len(system) + len(conversation)))
    chat.submission.request["response"] = meta
    return ResponseJob(replace(chat, submission=replace(chat.submission, input_field="input")), meta)
