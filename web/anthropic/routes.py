"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic's Messages API),
served through the job queue as ``/v1/chat/completions`` is.

A message is a ``chat`` job (:mod:`web.anthropic.convert`), queued, cancellable and visible
in ``/jobs`` like any other; its id is ``msg_<job id>`` and the ``X-Job-Id`` header names
the job. Without ``stream`` the route waits for the job (a failed, cancelled or timed-out job
is an error in Anthropic's shape); with it, the job's events become Anthropic's events
(:mod:`web.anthropic.stream`). ``count_tokens`` renders the same prompt with the model's chat
template and counts it with its tokenizer, in the web, without a job.
"""
from __future__ import annotations

import logging
from typing import Any

from flask import jsonify
from flask_openapi3 import APIBlueprint, Tag

from core.logs import log_event
from web import prompt_text
from web.anthropic.convert import messages_job
from web.anthropic.schemas import AnthropicError, CountTokensRequest, MessageObject, MessagesRequest, TokenCount
from web.anthropic.shape import message
from web.anthropic.stream import stream_message
from web.context import ctx
from web.errors import ApiError
from web.openai.responses import model_id
from web.openai.follow import event_stream
from web.job_wait import finished_job  # waits; maps failed/cancelled/timeout to errors
from web.text_model import text_model  # the named model's tokenizer and template (404/503)
from web.stream_limit import freed_on_error, limited, take_stream_slot
from web.submit import submit

logger = logging.getLogger("miniserve.web.anthropic")
api = APIBlueprint("anthropic", __name__, url_prefix="/v1",
                   abp_tags=[Tag(name="anthropic", description="Anthropic Messages API (through the queue)")])
ERRORS: dict[int, Any] = {code: AnthropicError for code in (400, 401, 404, 409, 413, 415, 429, 500, 503, 504)}


@api.post("/messages", summary="Create a message (Anthropic Messages API), optionally streamed",
          responses={200: MessageObject, **ERRORS})
def create_message(body: MessagesRequest):
    """Runs as a ``chat`` job. MiniServe extensions in the body: ``generation_method``,
    ``seed``, ``repetition_penalty``."""
    chat = messages_job(body)
    slot = take_stream_slot() if chat.stream else None  # a 429 here submits no job
    with freed_on_error(slot):
        job = submit(chat.submission).job
    log_event(logger, "message_submitted", job_id=job.id, stream=chat.stream,
              tools=len(chat.tools.names) if chat.tools else 0)
    model = job.request.get("model") or model_id(ctx().settings)
    if chat.stream:
        return limited(event_stream(stream_message(ctx().store, ctx().celery, job, chat, model), job.id), slot)
    done = finished_job(job.id)
    response = jsonify(message(done, chat, model, result=done.result or {}))
    response.headers["X-Job-Id"] = job.id
    return response


@api.post("/messages/count_tokens", summary="The prompt's tokens, as /v1/messages would send it "
          "(Anthropic-compatible)", responses={200: TokenCount, **ERRORS})
def count_tokens(body: CountTokensRequest):
    """Counted in the web with the model's chat template and tokenizer (tools, and the line a
    forced ``tool_choice`` adds, included); no job runs."""
    request = messages_job(body).submission.request
    model = text_model(body.model)
    if model.template is None:
        raise ApiError(503, "tokenizer_unavailable", "the model's chat template is not prepared here yet",
                       retry_after=5)
    counted = prompt_text.count(model, request)
    if not counted.exact:
        raise ApiError(422, "validation_error", "messages: the model's chat template refused these messages",
                       field="messages")
    return jsonify({"input_tokens": counted.tokens})
