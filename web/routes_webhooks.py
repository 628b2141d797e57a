"""``/webhooks/dead``: webhook deliveries that ran out of tries, and replaying one.

A key sees and replays only its own jobs' dead letters (with keys off, everyone sees all,
as with jobs). Replay puts the delivery back in the outbox with a new round of tries; the
receiver gets the same ``webhook-id`` as before, so it can tell a replay from a new message.
"""
from __future__ import annotations

import logging
from typing import Any

from flask import jsonify
from flask_openapi3 import APIBlueprint, Tag
from pydantic import BaseModel, Field

from core.keys import InvalidJobId, JobId
from core.logs import log_event
from core.webhooks import NotDead, task_sender, webhook_store
from web.context import ctx, request_owner
from web.errors import ApiError
from web.schemas import ErrorResponse, JobPath

logger = logging.getLogger("miniserve.web.webhooks")
api = APIBlueprint("webhooks", __name__, abp_tags=[Tag(name="webhooks", description="webhook dead letters")])
GUARD_ERRORS: dict[int, Any] = {401: ErrorResponse, 429: ErrorResponse, 503: ErrorResponse}


class DeadLetter(BaseModel):
    job_id: str
    url: str
    round: int = Field(description="1, then one more per replay")
    tries: int = Field(description="tries of this round")
    state: str = Field(description="dead (listed here), or pending/delivering/retrying/delivered")
    created_at: float | None = None
    updated_at: float | None = None
    dead_at: float | None = None
    last_answer: dict[str, Any] | None = Field(None, description="{status} of the last try, or {error, message}")


class DeadLetters(BaseModel):
    dead: list[DeadLetter]


class Replayed(BaseModel):
    job_id: str
    round: int
    state: str


def kick(job_id: str) -> None:
    """Claim the job's due webhook try now and send it (best effort: the workers' reaper loop
    sends any due entry anyway)."""
    try:
        webhook_store(ctx().store.client, ctx().settings).dispatch(task_sender(ctx().celery), [job_id])
    except Exception as exc:  # noqa: BLE001
        log_event(logger, "webhook_kick_failed", level=logging.WARNING, job_id=job_id, error=type(exc).__name__)


@api.get("/webhooks/dead", summary="Webhook deliveries that ran out of tries (newest first)",
         responses={200: DeadLetters, **GUARD_ERRORS})
def dead_letters():
    entries = webhook_store(ctx().store.client, ctx().settings).dead(owner=request_owner())
    return jsonify({"dead": entries})


@api.post("/webhooks/dead/<job_id>/replay", summary="Deliver a dead letter again (a new round of tries)",
          responses={202: Replayed, 404: ErrorResponse, 422: ErrorResponse, **GUARD_ERRORS})
def replay(path: JobPath):
    try:
        job_id = JobId(path.job_id)
        round_no = webhook_store(ctx().store.client, ctx().settings).replay(job_id, owner=request_owner())
    except (InvalidJobId, NotDead):
        raise ApiError(404, "dead_letter_not_found", f"no dead webhook for job '{path.job_id[:64]}'",
                       field="job_id") from None
    kick(job_id)
    log_event(logger, "webhook_replayed", job_id=job_id, round=round_no)
    response = jsonify({"job_id": job_id, "round": round_no, "state": "pending"})
    response.status_code = 202
    return response
