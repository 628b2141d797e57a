"""Shaping a job as Ollama answers: one JSON object, or NDJSON lines ending with ``done: true``.

Every line carries ``model`` and ``created_at`` (RFC 3339, UTC); ``/api/chat`` lines carry
``message`` and ``/api/generate`` lines ``response``. The last one adds ``done_reason``
(``stop`` or ``length``; ``load`` when nothing ran) and the counts and durations in
nanoseconds: ``prompt_eval_count`` / ``eval_count`` are the job's prompt and generated
tokens, ``prompt_eval_duration`` its time to first token, ``eval_duration`` the rest of its
run, ``total_duration`` from the request's arrival to its end (queue wait included), and
``load_duration`` 0 (workers keep their model loaded). Tool calls come as Ollama sends them,
``arguments`` an object, in a line before the last.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from core.jobs import JobRecord
from web.openai.convert import ChatJob
from web.openai.responses import final_answer

NS = 1_000_000_000


def created_at(at: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if at is None else at, timezone.utc).isoformat().replace("+00:00", "Z")


def done_reason(result: dict[str, Any]) -> str:
    return "length" if result.get("finish_reason") == "length" else "stop"


def stats(job: JobRecord, result: dict[str, Any], ended_at: float | None = None) -> dict[str, Any]:
    """The last line's counts and durations (nanoseconds)."""
    usage, timings = result.get("usage") or {}, result.get("timings") or {}
    ttft, total = float(timings.get("ttft_s") or 0.0), float(timings.get("total_s") or 0.0)
    ended = ended_at or job.finished_at or time.time()
    return {"total_duration": int(max(0.0, ended - job.created_at) * NS), "load_duration": 0,
            "prompt_eval_count": int(usage.get("prompt_tokens", 0)), "prompt_eval_duration": int(ttft * NS),
            "eval_count": int(usage.get("completion_tokens", 0)), "eval_duration": int(max(0.0, total - ttft) * NS)}


def ollama_calls(calls: list[Any]) -> list[dict[str, Any]]:
    return [{"function": {"index": i, "name": call.name, "arguments": call.arguments}} for i, call in enumerate(calls)]


def chat_message(chat: ChatJob, text: str) -> dict[str, Any]:
    """The assistant message of a finished chat: its content, and its tool calls when valid ones were written."""
    answer = final_answer(chat, text)
    message: dict[str, Any] = {"role": "assistant", "content": answer.content or ""}
    if answer.calls:
        message["tool_calls"] = ollama_calls(answer.calls)
    return message


def ready(model: str, chat: bool) -> dict[str, Any]:
    """The answer to an empty request: Ollama's way of asking that the model be loaded."""
    body = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return {"model": model, "created_at": created_at(), **body, "done": True, "done_reason": "load"}


def line(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False) + "\n"


class Lines:
    """The NDJSON lines of one streamed job (chat: ``message`` pieces; generate: ``response``)."""

    def __init__(self, job: JobRecord, model: str, chat: ChatJob | None) -> None:
        self.job, self.model, self.chat = job, model, chat

    def piece(self, text: str) -> str:
        body = {"message": {"role": "assistant", "content": text}} if self.chat else {"response": text}
        return line({"model": self.model, "created_at": created_at(), **body, "done": False})

    def keepalive(self) -> str:
        """An empty piece: keeps the connection tested (a gone client is noticed) and adds nothing."""
        return self.piece("")

    def buffered(self) -> bool:
        """Tools: whether the text is a call is known only at the end, so no text goes out before it."""
        return self.chat is not None and self.chat.tools is not None

    def ending(self, result: dict[str, Any]) -> list[str]:
        out = []
        if self.buffered():
            message = chat_message(self.chat, str(result.get("text") or ""))
            if message["content"] or message.get("tool_calls"):
                out.append(line({"model": self.model, "created_at": created_at(), "message": message,
                                 "done": False}))
        body = {"message": {"role": "assistant", "content": ""}} if self.chat else {"response": ""}
        out.append(line({"model": self.model, "created_at": created_at(), **body, "done": True,
                         "done_reason": done_reason(result), **stats(self.job, result, time.time())}))
        return out

    @staticmethod
    def error(message: str) -> str:
        return line({"error": message})


def chat_reply(job: JobRecord, chat: ChatJob, model: str) -> dict[str, Any]:
    result = job.result or {}
    return {"model": model, "created_at": created_at(job.finished_at),
            "message": chat_message(chat, str(result.get("text") or "")), "done": True,
            "done_reason": done_reason(result), **stats(job, result)}


def generate_reply(job: JobRecord, model: str, text: str) -> dict[str, Any]:
    result = job.result or {}
    return {"model": model, "created_at": created_at(job.finished_at), "response": text, "done": True,
            "done_reason": done_reason(result), **stats(job, result)}
