"""Cancelling a job on a client's behalf (it left, or it cancelled the batch the job is in)."""
from __future__ import annotations

import logging
from typing import Any

from core.events import QUEUED
from core.jobs import JobRecord, JobStore
from core.logs import log_event
from web.admission import release
from web.routes_webhooks import kick

logger = logging.getLogger("miniserve.web.cancel")


def cancel_job(store: JobStore, celery: Any, job_id: str) -> tuple[JobRecord, bool]:
    """Raise the job's cancel flag (a queued job ends ``cancelled`` at once, and its task is
    revoked too, best effort: a worker that still receives it skips it); returns the job and
    whether it was still queued. A running job stops between tokens, its KV blocks freed."""
    was_queued = store.get(job_id).state == QUEUED
    job = store.request_cancel(job_id)
    if was_queued and job.webhook_url:  # the cancel ended the job here: its webhook is due now
        kick(job_id)
    if was_queued:
        try:
            celery.control.revoke(job_id)
        except Exception as exc:  # noqa: BLE001 - the job already ended cancelled in the store
            log_event(logger, "revoke_failed", level=logging.WARNING, job_id=job_id, error=type(exc).__name__)
        release(job.queue)  # it left its line: a held job may take its place
    return job, was_queued


def cancel_jobs(store: JobStore, celery: Any, job_ids: list[str], reason: str) -> None:
    """Cancel a batch's open jobs as ``POST /jobs/{id}/cancel`` does (``reason`` is logged)."""
    for job_id in job_ids:
        cancel_job(store, celery, job_id)
    log_event(logger, "batch_jobs_cancelled", jobs=len(job_ids), reason=reason)
