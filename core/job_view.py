"""The public shape of a job: what ``GET /jobs/{id}`` answers and what a webhook POSTs.

One function for both, so a webhook receiver reads exactly the record a client polling the
job would read (the owner stays private)."""
from __future__ import annotations

from typing import Any

from core.jobs import JobRecord


def plain_links(job_id: str) -> dict[str, str]:
    """The job's links as paths (the worker has no Flask ``url_for``; the routes are these)."""
    return {"self": f"/jobs/{job_id}", "events": f"/jobs/{job_id}/events", "cancel": f"/jobs/{job_id}/cancel"}


def public_record(job: JobRecord, links: dict[str, str] | None = None) -> dict[str, Any]:
    """The public view of a job, with usage and timings lifted out of the result."""
    view = job.public_view()
    result = job.result or {}
    timings: dict[str, Any] = dict(result.get("timings") or {})
    if job.started_at is not None:
        timings["queue_wait_s"] = round(job.started_at - job.created_at, 4)
    if job.finished_at is not None:
        timings["job_total_s"] = round(job.finished_at - job.created_at, 4)
    view.update(usage=result.get("usage"), timings=timings, links=links or plain_links(job.id))
    return view
