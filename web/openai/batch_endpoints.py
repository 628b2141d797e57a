"""The endpoints a batch's lines may call, each as the same three steps its route takes:
validate the body (its request model, so its field table), build the job, shape the answer.

A batch line's answer is shaped again from its stored body when the batch finishes (tools
and tool choice, or echo and logprobs, decide how the text reads); a body the limits
refuse by then (a setting changed since it was queued) is shaped plainly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from core.jobs import JobRecord
from web.errors import ApiError
from web.openai.completion_answer import text_completion
from web.openai.completion_convert import CompletionJob, completion_job
from web.openai.completion_schemas import CompletionRequest
from web.openai.convert import ChatJob, chat_job
from web.openai.responses import completion
from web.openai.schemas import ChatCompletionRequest
from web.submit import Submission


@dataclass(frozen=True)
class Endpoint:
    model: type[BaseModel]                       # the request model (its field table runs first)
    job: Callable[[Any], Any]                    # body -> ChatJob | CompletionJob (has .submission, .stream)
    answer: Callable[[JobRecord, dict[str, Any], str], dict[str, Any]]  # finished job -> the response body


def _chat_answer(job: JobRecord, body: dict[str, Any], model: str) -> dict[str, Any]:
    try:
        chat = chat_job(ChatCompletionRequest.model_validate(body))
    except (ApiError, ValidationError):
        chat = ChatJob(Submission("chat", job.request, "messages"), None, False, False)
    return completion(job, chat, model)


def _text_answer(job: JobRecord, body: dict[str, Any], model: str) -> dict[str, Any]:
    try:
        cjob = completion_job(CompletionRequest.model_validate(body))
    except (ApiError, ValidationError):
        prompts = list(job.request.get("prompts") or [])
        cjob = CompletionJob(Submission("completion", job.request, "prompt"), prompts,
                             int(job.request.get("n") or 1), False, False, False, None)
    return text_completion(job, cjob, model)


ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": Endpoint(ChatCompletionRequest, chat_job, _chat_answer),
    "/v1/completions": Endpoint(CompletionRequest, completion_job, _text_answer),
}
