"""A ``/v1/responses`` job as OpenAI's Response object, from the job record alone.

Everything is derived from the record (the stored request's ``"response"`` part, the result,
the state), so ``POST`` (waiting), the stream's last event, ``GET /v1/responses/{id}`` and a
later ``previous_response_id`` all see the same answer. The answer is read as
``/v1/chat/completions`` reads it (:func:`web.openai.tool_calls.recognise`): valid calls of
declared functions become ``function_call`` items, the rest an assistant ``message``.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from core.events import CANCELLED, EXPIRED, FAILED, QUEUED, SUCCEEDED, TIMEOUT
from core.jobs import JobRecord
from web.errors import ApiError
from web.openai.call_stream import call_id
from web.openai.responses import extension
from web.openai.tool_calls import Recognised, ToolSet, compile_tools, recognise

RESPONSE_PREFIX = "resp_"


def response_id(job_id: str) -> str:
    return RESPONSE_PREFIX + job_id


def message_id(job_id: str) -> str:
    return f"msg_{job_id}"


def call_item_id(job_id: str, index: int) -> str:
    return f"fc_{job_id[:20]}_{index}"


def stored_response(response_id_: str, find: Callable[[str], JobRecord], field: str | None = None) -> JobRecord:
    """The job behind a stored response, or a 404 (not a response id, not the caller's, not a
    Responses job, or made with ``store: false``)."""
    missing = ApiError(404, "response_not_found", f"{field + ': ' if field else ''}no stored response "
                       f"{response_id_[:80]!r}", field=field)
    if not response_id_.startswith(RESPONSE_PREFIX):
        raise missing
    try:
        job = find(response_id_[len(RESPONSE_PREFIX):])
    except ApiError:
        raise missing from None
    meta = job.request.get("response")
    if job.type != "chat" or not isinstance(meta, dict) or not meta.get("store", True):
        raise missing
    return job


def tool_set_of(job: JobRecord) -> ToolSet | None:
    """The request's functions (None when the model did not see them: no tools, ``none``)."""
    tools = job.request.get("tools")
    if not tools:
        return None
    meta = job.request["response"]
    choice = meta.get("tool_choice")
    only = choice["name"] if isinstance(choice, dict) else None
    return compile_tools(tools, only=only, parallel=meta.get("parallel_tool_calls", True))


def answer_of(job: JobRecord) -> Recognised:
    text = str((job.result or {}).get("text", ""))
    tools = tool_set_of(job)
    return recognise(text, tools) if tools is not None else Recognised(content=text)


def assistant_turn(job: JobRecord) -> dict[str, Any]:
    """The answer as the stored chat message a next turn starts from (arguments as objects)."""
    answer = answer_of(job)
    turn: dict[str, Any] = {"role": "assistant", "content": answer.content or ""}
    if answer.calls:
        turn["tool_calls"] = [{"id": call_id(job.id, i), "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}}
                              for i, c in enumerate(answer.calls)]
    return turn


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(job_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [text_part(text)] if text is not None else []
    return {"id": message_id(job_id), "type": "message", "role": "assistant", "status": status, "content": content}


def call_item(job_id: str, index: int, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": call_item_id(job_id, index), "type": "function_call", "call_id": call_id(job_id, index),
            "name": name, "arguments": arguments, "status": status}


def output_items(job: JobRecord, answer: Recognised, status: str) -> list[dict[str, Any]]:
    """The message (when there is text, or nothing else) then the calls."""
    item_status = "incomplete" if status == "incomplete" else "completed"
    items = []
    if answer.content or not answer.calls:
        items.append(message_item(job.id, answer.content or "", item_status))
    items += [call_item(job.id, i, c.name, json.dumps(c.arguments, ensure_ascii=False), "completed")
              for i, c in enumerate(answer.calls)]
    return items


def usage(result: dict[str, Any]) -> dict[str, Any]:
    raw = result.get("usage") or {}
    prompt, completion = int(raw.get("prompt_tokens", 0)), int(raw.get("completion_tokens", 0))
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion,
            "input_tokens_details": {"cached_tokens": int(raw.get("cached_tokens", 0)), "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}}


def status_of(job: JobRecord, answer: Recognised | None) -> str:
    if job.state == SUCCEEDED:
        cut = (job.result or {}).get("finish_reason") == "length"
        return "incomplete" if cut and answer is not None and not answer.calls else "completed"
    if job.state == QUEUED:
        return "queued"
    if job.state == CANCELLED:
        return "cancelled"
    return "failed" if job.state in (FAILED, TIMEOUT, EXPIRED) else "in_progress"


def error_of(job: JobRecord) -> dict[str, Any] | None:
    if job.state not in (FAILED, TIMEOUT, EXPIRED, CANCELLED):
        return None
    error = job.error or {}
    return {"code": "server_error", "message": str(error.get("message") or error.get("reason") or job.state)}


def response_object(job: JobRecord, model: str, output: list[dict[str, Any]] | None = None,
                    status: str | None = None) -> dict[str, Any]:
    """The Response object for the job now; ``output``/``status`` given: the stream's own view."""
    answer = answer_of(job) if job.state == SUCCEEDED else None
    status = status or status_of(job, answer)
    if output is None:
        output = output_items(job, answer, status) if answer is not None else []
    meta, sampling, result = job.request.get("response") or {}, job.request.get("sampling") or {}, job.result or {}
    return {
        "id": response_id(job.id), "object": "response", "created_at": job.created_at,
        "completed_at": job.finished_at if status == "completed" else None, "status": status,
        "model": model, "output": output, "error": error_of(job),
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": meta.get("instructions"), "previous_response_id": meta.get("previous_response_id"),
        "tools": meta.get("tools", []), "tool_choice": meta.get("tool_choice") or "auto",
        "parallel_tool_calls": meta.get("parallel_tool_calls", True), "text": meta.get("text"),
        "temperature": sampling.get("temperature"), "top_p": sampling.get("top_p"),
        "max_output_tokens": meta.get("max_output_tokens"), "store": meta.get("store", True),
        "truncation": "disabled", "background": meta.get("background", False), "metadata": None,
        "usage": usage(result) if job.state == SUCCEEDED else None, "miniserve": extension(job, result),
    }
