"""A ``/v1/messages`` request as the same ``chat`` job ``/v1/chat/completions`` makes.

The Messages body is rewritten as a chat body and goes through the chat path
(:func:`web.openai.convert.chat_job_of`): one set of checks, grammars and job shape, so
``tool_choice`` is held by the same grammar. The mapping:

- ``system`` (a string or text blocks) -> the first system message;
- a turn's text blocks -> its text; an assistant's ``tool_use`` blocks -> ``tool_calls``
  (``input`` as the arguments); a user's ``tool_result`` blocks -> ``tool`` messages
  (``is_error``: the text is prefixed ``Error: ``), before the turn's own text;
- ``max_tokens`` -> ``max_tokens``, ``stop_sequences`` (and the extension ``stop``) ->
  ``stop``; the shared sampling fields (``temperature``, ``top_p``, ``top_k`` and the
  extensions) as they are (omitted temperature: greedy);
- ``tools`` -> function tools (``input_schema`` as ``parameters``); ``tool_choice``
  ``auto`` / ``any`` / ``tool`` / ``none`` -> ``auto`` / ``required`` / the named function /
  ``none``; ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``.

Errors the chat path raises name the chat field; they are renamed to the Messages field here.
"""
from __future__ import annotations

import json
import re
from typing import Any

from web.anthropic.schemas import MessageParam, MessagesRequest, PromptFields, TextBlock, ToolResultBlock
from web.openai.convert import ChatJob, chat_job_of
from web.sampling_base import SHARED_FIELDS, stop_list

ERROR_PREFIX = "Error: "
RENAMES = (("stop", "stop_sequences"),)
_CHAT_TOOL_FIELD = re.compile(r"^tools\.(\d+)\.function(?:\.(name|parameters|description))?")
_TOOL_KEYS = {"name": "name", "parameters": "input_schema", "description": "description", None: ""}


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(block.text for block in content)


def _tool_result(block: ToolResultBlock) -> dict[str, Any]:
    text = _text(block.content)
    return {"role": "tool", "content": ERROR_PREFIX + text if block.is_error else text,
            "tool_call_id": block.tool_use_id}


def _turn(message: MessageParam) -> list[dict[str, Any]]:
    """One Anthropic turn as chat messages (a user turn with tool results: several)."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    text = "".join(block.text for block in message.content if block.type == "text")
    if message.role == "assistant":
        calls = [{"id": block.id, "type": "function",
                  "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}}
                 for block in message.content if block.type == "tool_use"]
        return [{"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}]
    results = [_tool_result(block) for block in message.content if block.type == "tool_result"]
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def chat_messages(body: PromptFields) -> list[dict[str, Any]]:
    system = [{"role": "system", "content": _text(body.system)}] if body.system else []
    return system + [m for message in body.messages for m in _turn(message)]


def _tool_choice(body: PromptFields) -> tuple[Any, bool | None]:
    """The chat ``tool_choice`` and ``parallel_tool_calls``."""
    choice = body.tool_choice
    if choice is None:
        return None, None
    parallel = False if getattr(choice, "disable_parallel_tool_use", None) else None
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def chat_body(body: PromptFields) -> dict[str, Any]:
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                "parameters": t.input_schema}}
             for t in body.tools] if body.tools is not None else None
    choice, parallel = _tool_choice(body)
    fields: dict[str, Any] = {"messages": chat_messages(body), "model": body.model, "tools": tools,
                              "tool_choice": choice, "parallel_tool_calls": parallel}
    if isinstance(body, MessagesRequest):
        fields.update({name: getattr(body, name) for name in SHARED_FIELDS})  # the shared base, as it is
        stops = list(body.stop_sequences or []) + stop_list(body)
        fields.update(max_tokens=body.max_tokens, stop=stops or None, stream=bool(body.stream))
    return {k: v for k, v in fields.items() if v is not None}


def renamed(field: str | None) -> str | None:
    """A chat body's field as the Messages body spells it (a message's index counts the system
    message and split turns too, so ``messages.N`` is just ``messages``)."""
    if field is None:
        return None
    if field.startswith("messages."):
        return "messages"
    tool = _CHAT_TOOL_FIELD.match(field)
    if tool is not None:
        key = _TOOL_KEYS[tool.group(2)]
        return f"tools.{tool.group(1)}" + (f".{key}" if key else "") + field[tool.end():]
    for old, new in RENAMES:
        if field == old or field.startswith(old + "."):
            return new + field[len(old):]
    return field


def messages_job(body: PromptFields) -> ChatJob:
    """Validate and build the chat job of a Messages body (or of a count_tokens body: the
    prompt that ``/v1/messages`` would send, never submitted)."""
    return chat_job_of(chat_body(body), renamed)
