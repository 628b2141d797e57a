"""``POST /v1/chat/completions`` and ``GET /v1/models``, served through the job queue.

``model`` picks one of the cluster's models (web/models.py); ``/v1/models`` lists them.

A chat request becomes a ``chat`` job (``core.tasks`` sends it to the generation task), so
it is queued, cancellable, visible in ``/jobs`` and on the monitor page like any other.
Without ``stream`` the route waits for the job (as ``/generate`` does). With ``stream`` it
follows the job's events and writes OpenAI chunks. Tool calls stream as ``tool_calls``
deltas as they are generated when the grammar fixes the answer's shape: forced calls
(``required``, a named function), and ``auto`` answers that open with a bare JSON call;
any other ``auto`` answer is held back until the end, because whether it holds a call is
only known then (keep-alive comments still go out for each token). A client that goes away mid-stream is
noticed on the next write (the server closes the generator) and its job is cancelled;
one that leaves a non-streaming request is noticed while it waits (``web.disconnect``).
"""
from __future__ import annotations

import logging
from typing import Any, Iterator

from flask import jsonify
from flask_openapi3 import APIBlueprint, Tag

from core.jobs import JobRecord, JobStore
from core.logs import log_event
from web.context import ctx
from web.job_wait import finished_job  # waits; maps failed/cancelled/timeout to errors
from web.models import model_card, model_cards
from web.openai.call_stream import ToolStream
from web.openai.convert import ChatJob, chat_job
from web.openai.logprobs import openai_logprobs
from web.openai.responses import ChunkWriter, completion, model_id
from web.openai.schemas import (
    ChatCompletion, ChatCompletionRequest, ModelCard, ModelList, ModelPath, OpenAIError,
)
from web.openai.follow import ERRORS, KEEPALIVE, event_stream, follow_job, stream_ending
from web.stream_limit import freed_on_error, limited, take_stream_slot
from web.submit import submit

logger = logging.getLogger("miniserve.web.openai")
api = APIBlueprint("openai", __name__, url_prefix="/v1",
                   abp_tags=[Tag(name="openai", description="OpenAI-compatible API (through the queue)")])


@api.post("/chat/completions", summary="Chat completion (OpenAI-compatible), optionally streamed",
          responses={200: ChatCompletion, **ERRORS})
def chat_completions(body: ChatCompletionRequest):
    """Runs as a ``chat`` job. MiniServe extensions in the body: ``generation_method``,
    ``top_k``, ``repetition_penalty``; the answer adds ``miniserve`` (job id, method,
    timings) and the ``X-Job-Id`` header."""
    chat = chat_job(body)
    slot = take_stream_slot() if chat.stream else None  # a 429 here submits no job
    with freed_on_error(slot):
        job = submit(chat.submission).job
    log_event(logger, "chat_submitted", job_id=job.id, stream=chat.stream,
              tools=len(chat.tools.names) if chat.tools else 0)
    model = job.request.get("model") or model_id(ctx().settings)
    if chat.stream:
        events = stream_completion(ctx().store, ctx().celery, job, chat, model)
        return limited(event_stream(events, job.id), slot)
    response = jsonify(completion(finished_job(job.id), chat, model))
    response.headers["X-Job-Id"] = job.id
    return response


@api.get("/models", summary="Every model a live worker serves (OpenAI-compatible)",
         responses={200: ModelList, **ERRORS})
def list_models():
    return jsonify({"object": "list", "data": model_cards()})


@api.get("/models/<path:model>", summary="One model (OpenAI-compatible); unknown id: 404 model_not_found",
         responses={200: ModelCard, 404: OpenAIError, **ERRORS})
def retrieve_model(path: ModelPath):
    return jsonify(model_card(path.model))


def stream_completion(store: JobStore, celery: Any, job: JobRecord, chat: ChatJob, model: str) -> Iterator[str]:
    """OpenAI chunks from the job's events, ``data: [DONE]`` last; cancels the job when the
    client leaves before its end. A token event's ``index`` names its choice (n > 1)."""
    writer = ChunkWriter(job, chat, model)
    buffered = chat.tools is not None
    calls = {i: ToolStream(job.id, chat.forced_calls, chat.tools.names) for i in range(chat.n)} if chat.tools is not None else {}

    def token(data: dict[str, Any]) -> Iterator[str]:
        index = int(data.get("index", 0))
        return _token(writer, data, index, buffered, calls.get(index))

    def ending(event_type: str, payload: dict[str, Any]) -> Iterator[str]:
        streamed = {i for i, c in calls.items() if c.streamed}
        return stream_ending(writer, event_type, payload, buffered, streamed)

    opening = [writer.delta({"role": "assistant", "content": ""}, index=index) for index in range(chat.n)]
    return follow_job(store, celery, job, opening, token, ending, writer.error)


def _token(writer: ChunkWriter, data: dict[str, Any], index: int, buffered: bool,
           calls: ToolStream | None) -> Iterator[str]:
    """A token event: content (with its tokens' log-probabilities), tool-call deltas, or a
    keep-alive (text held back)."""
    text = data.get("text", "")
    if calls is not None:
        deltas = calls.feed(text)
        for delta in deltas:
            yield writer.delta({"tool_calls": [delta]}, index=index)
        if not deltas:
            yield KEEPALIVE
    elif buffered:
        yield KEEPALIVE
    else:
        entries = data.get("logprobs")
        logprobs = openai_logprobs(entries) if writer.chat.logprobs and entries else None
        yield writer.delta({"content": text}, logprobs=logprobs, index=index)
