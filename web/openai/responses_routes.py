"""``POST /v1/responses`` and ``GET /v1/responses/{id}`` (OpenAI's Responses API), through the queue.

A response is a ``chat`` job (:mod:`web.openai.responses_convert`), queued, cancellable and
visible in ``/jobs`` like any other; its id is ``resp_<job id>``. Without ``stream`` the
route waits for the job, as ``/v1/chat/completions`` does (a failed, cancelled or timed-out
job is the same OpenAI error); with it, the job's events become Responses events
(:mod:`web.openai.responses_stream`); with ``background`` it answers at once (``queued``)
and the client polls ``GET /v1/responses/{id}`` or cancels with ``POST .../cancel``.
``store`` (default true) keeps the response readable and continuable
(``previous_response_id``) for as long as the job record lives (``MINISERVE_JOB_TTL_S``).
"""
from __future__ import annotations

import logging

from flask import Response, jsonify
from flask_openapi3 import APIBlueprint, Tag

from core.jobs import JobRecord
from core.logs import log_event
from web.cancel import cancel_job
from web.context import ctx
from web.errors import ApiError
from web.openai.responses import model_id
from web.openai.responses_convert import response_job
from web.openai.responses_schemas import ResponseIdPath, ResponseObject, ResponseRequest
from web.openai.responses_shape import response_object, stored_response
from web.openai.responses_stream import stream_response
from web.openai.follow import ERRORS, event_stream
from web.job_wait import finished_job  # waits; maps failed/cancelled/timeout to errors
from web.routes_jobs import find_job
from web.stream_limit import freed_on_error, limited, take_stream_slot
from web.submit import submit

logger = logging.getLogger("miniserve.web.openai")
api = APIBlueprint("openai_responses", __name__, url_prefix="/v1",
                   abp_tags=[Tag(name="openai", description="OpenAI-compatible API (through the queue)")])


@api.post("/responses", summary="Create a response (OpenAI Responses API), optionally streamed",
          responses={200: ResponseObject, **ERRORS})
def create_response(body: ResponseRequest):
    """Runs as a ``chat`` job. MiniServe extensions in the body: ``generation_method``,
    ``top_k``, ``repetition_penalty``, ``seed``; the answer adds ``miniserve`` (job id,
    method, timings) and the ``X-Job-Id`` header."""
    spec = response_job(body, find_job)
    chat = spec.chat
    slot = take_stream_slot() if chat.stream else None  # a 429 here submits no job
    with freed_on_error(slot):
        job = submit(chat.submission).job
    log_event(logger, "response_submitted", job_id=job.id, stream=chat.stream,
              tools=len(chat.tools.names) if chat.tools else 0, continued=spec.meta["previous_response_id"] is not None)
    model = job.request.get("model") or model_id(ctx().settings)
    if chat.stream:
        events = stream_response(ctx().store, ctx().celery, job, chat, model)
        return limited(event_stream(events, job.id), slot)
    done = ctx().store.get(job.id) if spec.meta["background"] else finished_job(job.id)
    return _answer(done, model)


def _answer(job: JobRecord, model: str | None = None) -> Response:
    response = jsonify(response_object(job, model or job.request.get("model") or model_id(ctx().settings)))
    response.headers["X-Job-Id"] = job.id
    return response


@api.get("/responses/<response_id>", summary="A stored response, as it stands now (queued, in progress, done)",
         responses={200: ResponseObject, **ERRORS})
def retrieve_response(path: ResponseIdPath):
    return _answer(stored_response(path.response_id, find_job))


@api.post("/responses/<response_id>/cancel", summary="Cancel a background response (its job)",
          responses={200: ResponseObject, **ERRORS})
def cancel_response(path: ResponseIdPath):
    """As OpenAI: only a ``background`` response can be cancelled (400 otherwise); one that
    already ended is answered as it is."""
    job = stored_response(path.response_id, find_job)
    if not job.request["response"].get("background"):
        raise ApiError(400, "not_background", "only a response created with background: true can be cancelled",
                       field="response_id")
    if not job.is_terminal:
        job, _ = cancel_job(ctx().store, ctx().celery, job.id)
        log_event(logger, "response_cancelled", job_id=job.id, state=job.state)
    return _answer(job)
