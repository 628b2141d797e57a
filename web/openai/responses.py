"""Shaping a finished chat job as OpenAI objects: ``chat.completion``, its stream chunks,
``usage`` and the model card."""
from __future__ import annotations

import json
from typing import Any

from core.jobs import JobRecord
from core.model_source import served_model_name
from core.settings import Settings
from web.openai.choices import result_choices
from web.openai.convert import ChatJob
from web.openai.logprobs import openai_logprobs
from web.openai.tool_calls import Recognised, openai_tool_calls, recognise


def model_id(settings: Settings) -> str:
    """The served model's name (:func:`core.model_source.served_model_name`)."""
    return served_model_name(settings)


def completion_id(job_id: str) -> str:
    return f"chatcmpl-{job_id}"


def usage(result: dict[str, Any]) -> dict[str, Any]:
    raw = result.get("usage") or {}
    prompt, completion = int(raw.get("prompt_tokens", 0)), int(raw.get("completion_tokens", 0))
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": int(raw.get("cached_tokens", 0))}}
    drafted, accepted = int(raw.get("draft_tokens", 0)), int(raw.get("accepted_draft_tokens", 0))
    if drafted:  # speculative drafts, in the terms of OpenAI's "predicted outputs"
        out["completion_tokens_details"] = {"accepted_prediction_tokens": accepted,
                                            "rejected_prediction_tokens": drafted - accepted}
    return out


def final_answer(chat: ChatJob, text: str) -> Recognised:
    """Tool calls when the request has tools and the text holds valid ones; else content."""
    if chat.tools is None:
        return Recognised(content=text)
    return recognise(text, chat.tools)


def finish_reason(answer: Recognised, choice: dict[str, Any]) -> str:
    """``choice``: a job result, or one of its choices (same keys)."""
    if answer.calls:
        return "tool_calls"
    return "length" if choice.get("finish_reason") == "length" else "stop"


def extension(job: JobRecord, result: dict[str, Any]) -> dict[str, Any]:
    """MiniServe's own fields: the job to look up, how it ran, how long it took."""
    return {"job_id": job.id, "generation_method": result.get("method"),
            "engine_finish_reason": result.get("finish_reason"), "timings": result.get("timings") or {}}


def choice_logprobs(chat: ChatJob, choice: dict[str, Any]) -> dict[str, Any] | None:
    """``choices[].logprobs`` when the request asked (one entry per generated token)."""
    return openai_logprobs(choice.get("logprobs")) if chat.logprobs else None


def _choice(job: JobRecord, chat: ChatJob, choice: dict[str, Any]) -> dict[str, Any]:
    answer = final_answer(chat, str(choice.get("text") or ""))
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.calls:
        message["tool_calls"] = openai_tool_calls(answer.calls, job.id)
    return {"index": choice["index"], "message": message, "finish_reason": finish_reason(answer, choice),
            "logprobs": choice_logprobs(chat, choice)}


def completion(job: JobRecord, chat: ChatJob, model: str) -> dict[str, Any]:
    result = job.result or {}
    return {"id": completion_id(job.id), "object": "chat.completion", "created": int(job.created_at),
            "model": model, "choices": [_choice(job, chat, c) for c in result_choices(result)],
            "usage": usage(result), "system_fingerprint": None, "miniserve": extension(job, result)}


class ChunkWriter:
    """Formats ``chat.completion.chunk`` events (``data: {...}``) for one job."""

    def __init__(self, job: JobRecord, chat: ChatJob, model: str) -> None:
        self.job, self.chat = job, chat
        self.base = {"id": completion_id(job.id), "object": "chat.completion.chunk",
                     "created": int(job.created_at), "model": model, "system_fingerprint": None}

    def _event(self, payload: dict[str, Any]) -> str:
        if self.chat.include_usage and "usage" not in payload:
            payload["usage"] = None
        return f"data: {json.dumps({**self.base, **payload}, ensure_ascii=False)}\n\n"

    def delta(self, delta: dict[str, Any], finish: str | None = None,
              logprobs: dict[str, Any] | None = None, index: int = 0) -> str:
        return self._event({"choices": [{"index": index, "delta": delta, "finish_reason": finish,
                                         "logprobs": logprobs}]})

    def ending(self, result: dict[str, Any], buffered: bool, streamed_calls: set[int] | bool = False) -> list[str]:
        """The closing chunks of every choice: tool calls (unless already streamed as deltas)
        or (when it was held back) the content, the finish reason; then usage. Streamed
        content carried its tokens' log-probabilities; held-back answers get theirs here."""
        out = []
        for choice in result_choices(result):
            index = choice["index"]
            calls_out = index in streamed_calls if isinstance(streamed_calls, set) else streamed_calls
            answer = final_answer(self.chat, str(choice.get("text") or ""))
            if answer.calls and not calls_out:
                calls = [{"index": i, **call} for i, call in enumerate(openai_tool_calls(answer.calls, self.job.id))]
                delta: dict[str, Any] = {"tool_calls": calls}
                if answer.content:
                    delta["content"] = answer.content
                out.append(self.delta(delta, index=index))
            elif buffered and answer.content:
                out.append(self.delta({"content": answer.content}, index=index))
            logprobs = choice_logprobs(self.chat, choice) if buffered else None
            out.append(self.delta({}, finish_reason(answer, choice), logprobs, index=index))
        if self.chat.include_usage:
            out.append(self._event({"choices": [], "usage": usage(result)}))
        return out

    @staticmethod
    def error(error_type: str, message: str, code: str) -> str:
        body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    @staticmethod
    def done() -> str:
        return "data: [DONE]\n\n"
