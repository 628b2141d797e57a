"""``POST /generate`` and ``POST /agent/run``, compatible with the original MiniServe.

Both enqueue a job and wait for its end, so old clients keep their request/response
shapes while the work runs on the queue; a client that closes its connection while
waiting has its job cancelled (``web.disconnect``). ``job_id`` is added to every answer (and to
every error) so a client can look the job up afterwards.
"""
from __future__ import annotations

import logging
from typing import Any

from flask import jsonify
from flask_openapi3 import APIBlueprint, Tag

from core.logs import log_event
from web.context import ctx
from web.job_wait import finished_job
from web.routes_jobs import BODY_ERRORS, GUARD_ERRORS, MODEL_ERRORS
from web.schemas import AgentBody, AgentResponse, ErrorResponse, GenerateBody, GenerateResponse
from web.sse import sse_response, stream_events
from web.stream_limit import freed_on_error, limited, take_stream_slot
from web.submit import from_agent_body, from_generate_body, submit

logger = logging.getLogger("miniserve.web.compat")
api = APIBlueprint("compat", __name__, abp_tags=[Tag(name="compat", description="original MiniServe API")])
WAIT_ERRORS: dict[int, Any] = {409: ErrorResponse, 500: ErrorResponse, 504: ErrorResponse}


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
    result = finished_job(job.id).result or {}
    return jsonify({"text": result.get("text", ""),
                    "generation_method": result.get("method", body.generation_method),
                    "usage": result.get("usage") or {}, "timings": result.get("timings") or {},
                    "finish_reason": result.get("finish_reason", ""), "job_id": job.id})


@api.post("/agent/run", summary="Run the tool-calling agent and wait for its answer and trace",
          responses={200: AgentResponse, **BODY_ERRORS, **GUARD_ERRORS, **MODEL_ERRORS, **WAIT_ERRORS})
def agent_run(body: AgentBody):
    """A malformed tool call or too many steps end the job ``failed``: 422 with the trace."""
    job = submit(from_agent_body(body)).job
    result = finished_job(job.id).result or {}
    trace = result.get("trace") or []
    return jsonify({"text": result.get("text", ""), "steps": int(result.get("steps", len(trace))),
                    "trace": trace, "job_id": job.id})
