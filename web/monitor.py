"""The monitor page (``/monitor``) and the one JSON call it polls (``GET /overview``).

The page is a template plus vanilla JS and CSS shipped in ``web/static/monitor`` (no CDN,
works offline). It is public, like ``/docs``: it holds no data itself. Everything it shows
comes from the API with the visitor's key when keys are configured: ``/overview`` (workers,
queues, recent jobs as compact rows), ``/jobs/{id}``, ``/jobs/{id}/events`` and
``/jobs/{id}/cancel``.
"""
from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, render_template
from flask_openapi3 import APIBlueprint, OpenAPI, Tag
from pydantic import BaseModel, Field

from core import routing
from core.jobs import JobRecord
from core.workers import list_workers
from web.admission import EVERYONE, gate
from web.context import ctx, request_owner
from core.webhooks import webhook_store
from web.guards import add_public_prefix, is_admin
from web.routes_jobs import GUARD_ERRORS, job_view
from web.routes_webhooks import DeadLetter
from web.worker_view import public_worker, routed_view
from web.schemas import ErrorResponse, JobListQuery, WorkerView

page = Blueprint("monitor", __name__, static_folder="static/monitor", static_url_path="/monitor/static",
                 template_folder="templates")
api = APIBlueprint("overview", __name__, abp_tags=[Tag(name="monitor", description="data for the monitor page")])
ROW_TIMINGS = ("queue_wait_s", "job_total_s", "ttft_s", "total_s", "decode_tokens_per_s")
ROW_USAGE = ("prompt_tokens", "completion_tokens", "cached_tokens", "draft_tokens", "accepted_draft_tokens")


class JobRow(BaseModel):
    id: str
    type: str
    state: str
    queue: str
    worker: str
    attempt: int
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    method: str | None = None
    finish_reason: str | None = None
    timings: dict[str, float] = Field(description="queue_wait_s, job_total_s, ttft_s, total_s, decode_tokens_per_s")
    usage: dict[str, int] = Field(description="prompt_tokens, completion_tokens, cached_tokens, "
                                              "draft_tokens, accepted_draft_tokens")
    routing: str | None = Field(None, description="routing decision (core/routing.py), for prompts with a prefix key")


class Overview(BaseModel):
    workers: list[WorkerView] = Field(description="each with `waiting` (its own queue) and `routed_here`")
    queues: dict[str, int] = Field(description="jobs waiting per queue: messages in its Celery list plus held ones")
    held: dict[str, dict[str, dict[str, int]]] = Field(
        description="jobs held at the fair gate: queue -> priority class -> key (`you`, another key's owner id "
                    "prefix for admin keys, else `others`) -> count")
    routing: dict[str, dict[str, int]] = Field(description="`decisions` counted by the web, `routed_to` per worker")
    jobs: list[JobRow]
    counts: dict[str, int] = Field(description="listed jobs by state")
    webhooks_dead: list[DeadLetter] = Field(description="webhook deliveries that ran out of tries "
                                            "(the caller's own; GET /webhooks/dead)")


def job_row(job: JobRecord) -> dict[str, Any]:
    """A job as one table row: no request or result text, just its numbers."""
    view = job_view(job)
    partial = (job.error or {}).get("partial")  # a cancelled or timed-out job's output so far
    result = job.result or (partial if isinstance(partial, dict) else {})
    timings = {**(result.get("timings") or {}), **(view.get("timings") or {})}
    timings = {k: float(v) for k, v in timings.items() if k in ROW_TIMINGS and v is not None}
    usage = {k: int(v) for k, v in (result.get("usage") or {}).items() if k in ROW_USAGE and v is not None}
    return {"id": job.id, "type": job.type, "state": job.state, "queue": job.queue, "worker": job.worker,
            "attempt": job.attempt, "created_at": job.created_at, "started_at": job.started_at,
            "finished_at": job.finished_at, "method": result.get("method") or job.request.get("method"),
            "finish_reason": result.get("finish_reason"), "timings": timings, "usage": usage,
            "routing": (job.request.get("routing") or {}).get("decision")}


@api.get("/overview", summary="Workers, queue depths and recent jobs (compact rows) for the monitor page",
         responses={200: Overview, 422: ErrorResponse, **GUARD_ERRORS})
def overview(query: JobListQuery):
    store = ctx().store
    jobs = store.list(state=query.state, job_type=query.type, owner=request_owner(), limit=query.limit)
    rows = [job_row(job) for job in jobs]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    workers, routed_to = cluster_workers(store.client), routing.routed_to(store.client)
    if not is_admin():  # hosts, pids, paths and other keys' job ids are for admin keys only
        workers, routed_to = [public_worker(w) for w in workers], routed_view(routed_to)
    return jsonify({"workers": workers, "queues": store.queue_depths(), "held": held_view(),
                    "routing": {"decisions": routing.counts(store.client), "routed_to": routed_to},
                    "jobs": rows, "counts": counts,
                    "webhooks_dead": webhook_store(store.client, ctx().settings).dead(owner=request_owner(), limit=20)})


def held_view() -> dict[str, dict[str, dict[str, int]]]:
    """Jobs held at the fair gate, per queue, class and key (docs/scheduling.md). A key shows
    as the first 8 characters of its owner id; other keys than the caller's are summed into
    ``others`` unless the caller is an admin key."""
    me, admin = request_owner() or EVERYONE, is_admin()
    view: dict[str, dict[str, dict[str, int]]] = {}
    for queue, classes in gate().held_by_class().items():
        for cls, owners in classes.items():
            shown: dict[str, int] = {}
            for owner, n in owners.items():
                label = "you" if owner == me else (owner[:8] if admin else "others")
                shown[label] = shown.get(label, 0) + n
            view.setdefault(queue, {})[cls] = shown
    return view


def cluster_workers(client) -> list[dict[str, Any]]:
    """Live workers, each with the jobs waiting in its own queue and the jobs routed to it."""
    workers = list_workers(client, ctx().settings.worker_max_age_s)
    waiting, routed = routing.waiting(client, workers), routing.routed_to(client)
    for worker in workers:
        worker["waiting"], worker["routed_here"] = waiting.get(worker["name"], 0), routed.get(worker["name"], 0)
    return workers


@page.get("/monitor")
def monitor_page() -> str:
    return render_template("monitor.html", refresh_ms=1500, auth=bool(ctx().settings.api_keys))


def register(app: OpenAPI) -> None:
    add_public_prefix(app, "/monitor")
    app.register_blueprint(page)
    app.register_api(api)
