"""``POST /api/chat`` and ``POST /api/generate``: the Ollama API on the same jobs as ``/v1``.

Each request is translated into the OpenAI route's request (``web.ollama.convert``), which
builds and submits the same ``chat`` or ``completion`` job; the route then waits for it
(``stream: false``) or follows its events (the default) and writes Ollama's NDJSON lines
(``web.ollama.shape``). A client that leaves a stream has its job cancelled, as on ``/v1``.
"""
from __future__ import annotations

import logging
from typing import Any, Iterator

from flask import Response, jsonify, stream_with_context
from flask_openapi3 import APIBlueprint, Tag

from core.events import CANCELLED, DONE, TIMEOUT
from core.jobs import JobRecord
from core.logs import log_event
from web.context import ctx
from web.models import pick_model
from web.ollama.convert import (
    chat_request, generate_chat_request, generate_completion_request, ollama_fields, uses_completion,
)
from web.ollama.context import check_num_ctx
from web.ollama.schemas import ChatRequest, ChatResponse, GenerateRequest, OllamaGenerateResponse, OllamaError
from web.ollama.shape import Lines, chat_reply, generate_reply, ready
from web.openai.choices import result_choices
from web.openai.completion_convert import completion_job
from web.openai.convert import ChatJob, chat_job
from web.openai.follow import KEEPALIVE, follow_job
from web.job_wait import finished_job  # waits; maps failed/cancelled/timeout to errors
from web.stream_limit import freed_on_error, limited, take_stream_slot
from web.submit import Submission, submit

logger = logging.getLogger("miniserve.web.ollama")
api = APIBlueprint("ollama", __name__, url_prefix="/api",
                   abp_tags=[Tag(name="ollama", description="Ollama-compatible API")])
ERRORS: dict[int, Any] = {code: OllamaError for code in (400, 401, 404, 409, 413, 415, 429, 500, 503, 504)}
NDJSON = "application/x-ndjson"
GENERATE_RENAMES = {"messages": "prompt"}  # generate's prompt is the chat job's user turn


@api.post("/chat", summary="Chat (Ollama API); NDJSON lines unless stream is false",
          responses={200: ChatResponse, **ERRORS})
def chat(body: ChatRequest):
    if not body.messages:
        return jsonify(ready(pick_model(body.model or None)[0], chat=True))
    with ollama_fields():
        job_spec = chat_job(chat_request(body))
    _check_context(body, job_spec.submission)
    return _run(job_spec.submission, body.stream, job_spec)


@api.post("/generate", summary="Generate from a prompt (Ollama API); NDJSON lines unless stream is false",
          responses={200: OllamaGenerateResponse, **ERRORS})
def generate(body: GenerateRequest):
    if not body.prompt and body.suffix is None:
        return jsonify(ready(pick_model(body.model or None)[0], chat=False))
    with ollama_fields(GENERATE_RENAMES):
        if uses_completion(body):
            submission = completion_job(generate_completion_request(body)).submission
            _check_context(body, submission)
            return _run(submission, body.stream, None)
        job_spec = chat_job(generate_chat_request(body))
        _check_context(body, job_spec.submission)
        return _run(job_spec.submission, body.stream, job_spec, as_generate=True)


def _check_context(body: ChatRequest | GenerateRequest, submission: Submission) -> None:
    if body.options is not None and body.options.num_ctx is not None:
        check_num_ctx(body.options.num_ctx, submission.request, body.model or None)


def _run(submission: Submission, stream: bool, chat: ChatJob | None, as_generate: bool = False) -> Response:
    """Submit the job, then answer it: streamed lines, or one object once it has ended.
    ``chat`` None: a completion job (generate's raw / suffix prompt)."""
    slot = take_stream_slot() if stream else None  # a 429 here submits no job
    with freed_on_error(slot), ollama_fields():
        job = submit(submission).job
    log_event(logger, "ollama_submitted", job_id=job.id, type=job.type, stream=stream)
    model = str(job.request.get("model") or "")
    lines = Lines(job, model, None if as_generate else chat)
    if stream:
        response = Response(stream_with_context(_lines(job, lines)), mimetype=NDJSON)
        response.headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Job-Id": job.id})
        return limited(response, slot)
    done = finished_job(job.id)
    if chat is not None and not as_generate:
        reply = chat_reply(done, chat, model)
    else:
        reply = generate_reply(done, model, str(result_choices(done.result or {})[0].get("text") or ""))
    response = jsonify(reply)
    response.headers["X-Job-Id"] = job.id
    return response


def _lines(job: JobRecord, lines: Lines) -> Iterator[str]:
    """The job's NDJSON lines: a piece per token (an empty one while tools hold the text back,
    or while the job waits), the closing lines, or an ``{"error"}`` line."""
    def token(data: dict[str, Any]) -> Iterator[str]:
        yield lines.keepalive() if lines.buffered() else lines.piece(str(data.get("text", "")))

    def ending(event_type: str, payload: dict[str, Any]) -> Iterator[str]:
        if event_type == DONE:
            yield from lines.ending(payload)
            return
        message = str(payload.get("message") or payload.get("reason") or event_type)
        prefix = {CANCELLED: "cancelled", TIMEOUT: "timed out"}.get(event_type, "failed")
        yield lines.error(f"the job {prefix}: {message}")

    def error(_type: str, message: str, _code: str) -> str:
        return lines.error(message)

    pieces = follow_job(ctx().store, ctx().celery, job, [], token, ending, error)
    try:
        for piece in pieces:
            yield lines.keepalive() if piece == KEEPALIVE else piece
    finally:
        pieces.close()  # a client gone mid-stream: follow_job cancels the job
