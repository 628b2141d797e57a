"""A finished ``/v1/messages`` job as Anthropic's Message object.

The answer is read as ``/v1/chat/completions`` reads it (:func:`web.openai.responses.final_answer`:
valid calls of declared tools, else text): the text (when there is any) is a ``text`` block,
each call a ``tool_use`` block. ``stop_reason``: ``tool_use`` when there are calls,
``max_tokens`` when the cap cut the answer, ``stop_sequence`` when one of the request's stop
strings ended it (named in ``stop_sequence``), else ``end_turn``. ``usage.input_tokens``
counts the prompt tokens the prefix cache did not hold, ``cache_read_input_tokens`` those
it did (Anthropic's split: their sum is the prompt).
"""
from __future__ import annotations

from typing import Any

from core.jobs import JobRecord
from web.openai.convert import ChatJob
from web.openai.responses import final_answer
from web.openai.tool_calls import Recognised

MESSAGE_PREFIX = "msg_"


def message_id(job_id: str) -> str:
    return MESSAGE_PREFIX + job_id


def tool_use_id(job_id: str, index: int) -> str:
    """The id of the job's ``index``-th call, the same in the stream and the final message."""
    return f"toolu_{job_id[:20]}_{index}"


def answer_of(chat: ChatJob, result: dict[str, Any]) -> Recognised:
    return final_answer(chat, str(result.get("text") or ""))


def stop_of(answer: Recognised, result: dict[str, Any]) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence``."""
    if answer.calls:
        return "tool_use", None
    if result.get("finish_reason") == "length":
        return "max_tokens", None
    if result.get("stop_sequence"):
        return "stop_sequence", str(result["stop_sequence"])
    return "end_turn", None


def usage(result: dict[str, Any]) -> dict[str, int]:
    raw = result.get("usage") or {}
    prompt, cached = int(raw.get("prompt_tokens", 0)), int(raw.get("cached_tokens", 0))
    return {"input_tokens": prompt - cached, "output_tokens": int(raw.get("completion_tokens", 0)),
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(job_id: str, index: int, name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id(job_id, index), "name": name, "input": arguments}


def content_blocks(job_id: str, answer: Recognised) -> list[dict[str, Any]]:
    """The text (if any) then the calls, as Anthropic orders an answer that explains and calls."""
    blocks = [text_block(answer.content)] if answer.content else []
    return blocks + [tool_use_block(job_id, i, call.name, call.arguments) for i, call in enumerate(answer.calls)]


def message(job: JobRecord, chat: ChatJob, model: str, content: list[dict[str, Any]] | None = None,
            result: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Message of a finished job; ``content`` and ``result`` left out: the stream's opening
    message (no content, no stop reason, zero usage)."""
    if result is None:
        stop: tuple[str | None, str | None] = (None, None)
        counts = usage({})
    else:
        answer = answer_of(chat, result)
        stop, counts = stop_of(answer, result), usage(result)
        content = content_blocks(job.id, answer) if content is None else content
    return {"id": message_id(job.id), "type": "message", "role": "assistant", "model": model,
            "content": content or [], "stop_reason": stop[0], "stop_sequence": stop[1], "usage": counts}
