"""``POST /generate`` and ``POST /agent/run``, compatible with the original MiniServe.

Both enqueue a job and wait for its end, so old clients keep their request/response
shapes while the work runs on the queue; a client that closes its connection while
waiting has its job cancelled (``web.disconnect``). ``job_id`` is added to every answer (and to
every error) so a client can look the job up afterwards.
"""
from __future__ import annotations

import logging
from typing import Any

from flask import jsonify, request
from flask_openapi3 import APIBlueprint, Tag

from core.events import AGENT_INPUT_ERRORS, CANCELLED, EXPIRED, SUCCEEDED, TIMEOUT
from core.jobs import JobRecord
from core.logs import log_event
from web.cancel import cancel_job
from web.context import ctx
from web.disconnect import client_gone
from web.errors import ApiError
from web.routes_jobs import BODY_ERRORS, GUARD_ERRORS, MODEL_ERRORS
from web.schemas import AgentBody, AgentResponse, ErrorResponse, GenerateBody, GenerateResponse
from web.sse import ClientGone, sse_response, stream_events, wait_for_end
from web.stream_limit import freed_on_error, limited, take_stream_slot
from web.submit import from_agent_body, from_generate_body, submit

logger = logging.getLogger("miniserve.web.compat")
api = APIBlueprint("compat", __name__, abp_tags=[Tag(name="compat", description="original MiniServe API")])
WAIT_ERRORS: dict[int, Any] = {409: ErrorResponse, 500: ErrorResponse, 504: ErrorResponse}


def abandon_job(job_id: str) -> None:
    """The client left while waiting: cancel its job so the worker stops (and frees its KV blocks)."""
    try:
        job, was_queued = cancel_job(ctx().store, ctx().celery, job_id)
        log_event(logger, "wait_abandoned", job_id=job_id, was_queued=was_queued, state=job.state)
    except Exception as exc:  # noqa: BLE001 - the client is gone; nobody to tell but the log
        log_event(logger, "wait_abandon_failed", level=logging.WARNING, job_id=job_id, error=type(exc).__name__)


def _finished(job_id: str) -> JobRecord:
    """Wait for the job; any end but ``succeeded`` becomes an error naming the job."""
    try:
        job = wait_for_end(ctx().store, job_id, ctx().settings.wait_timeout_s,
                           gone=lambda: client_gone(request.environ))
    except ClientGone:
        abandon_job(job_id)
        raise ApiError(499, "client_closed_request", "the client closed the connection; its job is cancelled",
                       job_id=job_id) from None
    if job is None:
        raise ApiError(504, "wait_timeout", f"the job did not finish within {ctx().settings.wait_timeout_s} s; "
                       f"follow it at /jobs/{job_id}", job_id=job_id)
    if job.state == SUCCEEDED:
        return job
    error = job.error or {}
    message = str(error.get("message") or error.get("reason") or job.state)
    if job.state == CANCELLED:
        raise ApiError(409, "job_cancelled", message, job_id=job_id)
    if job.state == TIMEOUT:
        raise ApiError(504, "job_timeout", message, job_id=job_id)
    if job.state == EXPIRED:
        raise ApiError(504, "job_expired", message, job_id=job_id)
    code = str(error.get("code") or "job_failed")
    if code in ("grammar_error", "context_exceeded"):  # the request's grammar, or a pool it cannot fit
        raise ApiError(422, code, message, job_id=job_id)
    if job.type == "agent" and code in AGENT_INPUT_ERRORS:
        raise ApiError(422, code, message, job_id=job_id, extra={"trace": error.get("trace") or []})
    raise ApiError(500, code, message, job_id=job_id)


@api.post("/generate", summary="Generate text and wait for it (or stream it with stream=true)",
          responses={200: GenerateResponse, **BODY_ERRORS, **GUARD_ERRORS, **MODEL_ERRORS, **WAIT_ERRORS})
def generate(body: GenerateBody):
    slot = take_stream_slot() if body.stream else None  # a 429 here submits no job
    with freed_on_error(slot):
        job = submit(from_generate_body(body)).job
    log_event(logger, "generate_submitted", job_id=job.id, stream=body.stream)
    if body.stream:
        return limited(sse_response(stream_events(ctx().store, job, 0, ctx().settings.sse_keepalive_s,
                                              ctx().feeds), job.id),
                       slot)
    result = _finished(job.id).result or {}
    return jsonify({"text": result.get("text", ""),
                    "generation_method": result.get("method", body.generation_method),
                    "usage": result.get("usage") or {}, "timings": result.get("timings") or {},
                    "finish_reason": result.get("finish_reason", ""), "job_id": job.id})


@api.post("/agent/run", summary="Run the tool-calling agent and wait for its answer and trace",
          responses={200: AgentResponse, **BODY_ERRORS, **GUARD_ERRORS, **MODEL_ERRORS, **WAIT_ERRORS})
def agent_run(body: AgentBody):
    """A malformed tool call or too many steps end the job ``failed``: 422 with the trace."""
    job = submit(from_agent_body(body)).job
    result = _finished(job.id).result or {}
    trace = result.get("trace") or []
    return jsonify({"text": result.get("text", ""), "steps": int(result.get("steps", len(trace))),
                    "trace": trace, "job_id": job.id})
