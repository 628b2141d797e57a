"""Waiting for a job's end on behalf of a client that asked for the whole answer: shared by
every non-streaming route (``/generate``, ``/agent``, ``/v1``, Ollama's). Any end but
``succeeded`` becomes an ``ApiError`` naming the job; a client that leaves cancels its job."""
from __future__ import annotations

import logging

from flask import request

from core.events import AGENT_INPUT_ERRORS, CANCELLED, EXPIRED, SUCCEEDED, TIMEOUT
from core.jobs import JobRecord
from core.logs import log_event
from web.cancel import cancel_job
from web.context import ctx
from web.disconnect import client_gone
from web.errors import ApiError
from web.sse import ClientGone, wait_for_end

logger = logging.getLogger("miniserve.web.compat")


def abandon_job(job_id: str) -> None:
    """The client left while waiting: cancel its job so the worker stops (and frees its KV blocks)."""
    try:
        job, was_queued = cancel_job(ctx().store, ctx().celery, job_id)
        log_event(logger, "wait_abandoned", job_id=job_id, was_queued=was_queued, state=job.state)
    except Exception as exc:  # noqa: BLE001 - the client is gone; nobody to tell but the log
        log_event(logger, "wait_abandon_failed", level=logging.WARNING, job_id=job_id, error=type(exc).__name__)


def finished_job(job_id: str) -> JobRecord:
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
