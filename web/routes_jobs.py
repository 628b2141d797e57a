"""``/jobs``: submit, read, list, cancel and stream jobs."""
from __future__ import annotations

import logging
from typing import Any

from flask import jsonify, url_for
from flask_openapi3 import APIBlueprint, Tag

from core.events import QUEUED
from core.job_view import public_record
from core.jobs import JobNotFound, JobRecord
from core.keys import InvalidJobId, JobId
from core.logs import log_event
from web.cancel import cancel_job as cancel
from web.context import ctx, note_job, request_owner
from web.errors import ApiError
from web.schemas import (
    ErrorResponse,
    EventsQuery,
    JobAccepted,
    JobList,
    JobListQuery,
    JobPath,
    JobSubmit,
    JobView,
    SSE_EVENT_SCHEMA,
    SubmitHeaders,
)
from web.sse import resume_point, sse_response, stream_events
from web.stream_limit import limited, take_stream_slot
from web.submit import from_job_body, submit

logger = logging.getLogger("miniserve.web.jobs")
api = APIBlueprint("jobs", __name__, abp_tags=[Tag(name="jobs", description="the job queue")])

GUARD_ERRORS: dict[int, Any] = {401: ErrorResponse, 429: ErrorResponse, 503: ErrorResponse}
BODY_ERRORS: dict[int, Any] = {400: ErrorResponse, 413: ErrorResponse, 415: ErrorResponse, 422: ErrorResponse}
MODEL_ERRORS: dict[int, Any] = {404: ErrorResponse}  # model_not_found (503 model_unavailable: GUARD_ERRORS)
SHOWN_ID_CHARS = 64  # a longer text in place of an id is echoed cut short
SSE_RESPONSE = {"description": "Server-Sent Events: `id: <seq>`, `event: <type>`, `data: <event JSON>`",
                "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}}}


def job_links(job_id: str) -> dict[str, str]:
    return {"self": url_for("jobs.get_job", job_id=job_id),
            "events": url_for("jobs.job_events", job_id=job_id),
            "cancel": url_for("jobs.cancel_job", job_id=job_id)}


def job_view(job: JobRecord) -> dict[str, Any]:
    """The public view of a job (core/job_view.py: the same record a webhook POSTs)."""
    return public_record(job, job_links(job.id))


def find_job(text: str) -> JobRecord:
    """The caller's job, or a 404: for another key's job (its existence stays private), and
    for text that is not a job id's shape (``<id>:events``), before any Redis key is built."""
    try:
        job_id = JobId(text)
    except InvalidJobId:
        shown = text if len(text) <= SHOWN_ID_CHARS else text[:SHOWN_ID_CHARS] + "..."
        raise ApiError(404, "job_not_found", f"no job '{shown}'", job_id=shown) from None
    note_job(job_id)
    try:
        return ctx().store.get(job_id, owner=request_owner())
    except JobNotFound:
        raise ApiError(404, "job_not_found", f"no job '{job_id}'", job_id=job_id) from None


def accepted(job: JobRecord, replayed: bool = False):
    response = jsonify({"id": job.id, "state": job.state, "links": job_links(job.id)})
    response.status_code = 202
    response.headers["Location"] = job_links(job.id)["self"]
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


@api.post("/jobs", summary="Submit a generation or agent job",
          responses={202: JobAccepted, **BODY_ERRORS, **GUARD_ERRORS, **MODEL_ERRORS})
def create_job(body: JobSubmit, header: SubmitHeaders):
    """Validates, checks limits, stores the job and sends its task by name; 202 at once."""
    outcome = submit(from_job_body(body), header.idempotency_key)
    log_event(logger, "job_submitted", job_id=outcome.job.id, job_type=outcome.job.type,
              replayed=outcome.replayed)
    return accepted(outcome.job, outcome.replayed)


@api.get("/jobs", summary="Recent jobs (newest first), filtered by state and type",
         responses={200: JobList, 422: ErrorResponse, **GUARD_ERRORS})
def list_jobs(query: JobListQuery):
    jobs = ctx().store.list(state=query.state, job_type=query.type, owner=request_owner(), limit=query.limit)
    return jsonify({"jobs": [job_view(job) for job in jobs]})


@api.get("/jobs/<job_id>", summary="One job: state, timings, usage, result or error",
         responses={200: JobView, 404: ErrorResponse, 422: ErrorResponse, **GUARD_ERRORS})
def get_job(path: JobPath):
    """A queued job also shows its place in line: ``queue_position`` (jobs ahead of it in its
    queue; 0 = next) and ``estimated_start`` (unix seconds, from the queue's recent starts)."""
    job = find_job(path.job_id)
    view = job_view(job)
    if job.state == QUEUED:
        place = ctx().store.place_in_line(job.id)
        view["queue_position"], view["estimated_start"] = place if place is not None else (None, None)
    return jsonify(view)


@api.post("/jobs/<job_id>/cancel", summary="Cancel a job (queued: revoked; running: stops between tokens)",
          responses={200: JobView, 404: ErrorResponse, 422: ErrorResponse, **BODY_ERRORS, **GUARD_ERRORS})
def cancel_job(path: JobPath):
    job, was_queued = cancel(ctx().store, ctx().celery, find_job(path.job_id).id)
    log_event(logger, "job_cancel_requested", job_id=job.id, was_queued=was_queued, state=job.state)
    return jsonify(job_view(job))


@api.get("/jobs/<job_id>/events", summary="The job's events as Server-Sent Events (replay, then live)",
         responses={200: SSE_RESPONSE, 400: ErrorResponse, 404: ErrorResponse, 422: ErrorResponse,
                    **GUARD_ERRORS})
def job_events(path: JobPath, query: EventsQuery):
    """Replays events after ``?after=`` or the ``Last-Event-ID`` header (default: all),
    then follows the job live until its terminal event."""
    job = find_job(path.job_id)
    after = resume_point(query.after)
    slot = take_stream_slot()
    return limited(sse_response(stream_events(ctx().store, job, after, ctx().settings.sse_keepalive_s,
                                              ctx().feeds), job.id),
                   slot)
