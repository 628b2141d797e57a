"""Service status: ``/healthz`` (public), ``/workers`` and ``/queues``."""
from __future__ import annotations

import redis
from flask import jsonify
from flask_openapi3 import APIBlueprint, Tag

from core.workers import list_workers
from web.context import ctx
from web.guards import is_admin
from web.worker_view import public_worker
from web.routes_jobs import GUARD_ERRORS
from web.schemas import HealthResponse, QueueDepths, WorkerList

api = APIBlueprint("system", __name__, abp_tags=[Tag(name="system", description="service status")])


@api.get("/healthz", summary="Redis reachable and workers seen (no key needed)",
         responses={200: HealthResponse, 503: HealthResponse}, openapi_extensions={"security": []})
def healthz():
    """200 while Redis answers (``status`` says whether any worker sent a heartbeat
    recently); 503 when Redis does not."""
    try:
        ctx().store.ping()
        workers = list_workers(ctx().store.client, ctx().settings.worker_max_age_s)
    except (redis.ConnectionError, redis.TimeoutError):
        response = jsonify({"status": "redis_unavailable", "redis": False, "workers": 0})
        response.status_code = 503
        response.headers["Retry-After"] = "5"
        return response
    return jsonify({"status": "ok" if workers else "no_workers", "redis": True, "workers": len(workers)})


@api.get("/workers", summary="Workers seen recently, with their info and cache statistics",
         responses={200: WorkerList, **GUARD_ERRORS})
def workers():
    """An admin key (or a stack without keys) sees each worker's whole heartbeat; any other key
    sees what it needs to use the service (models, load, cache statistics), with no host, pid,
    path or other keys' job ids: a shared service tells one client nothing about another."""
    seen = list_workers(ctx().store.client, ctx().settings.worker_max_age_s)
    return jsonify({"workers": seen if is_admin() else [public_worker(w) for w in seen]})


@api.get("/queues", summary="Messages waiting in each Celery queue",
         responses={200: QueueDepths, **GUARD_ERRORS})
def queues():
    return jsonify({"queues": ctx().store.queue_depths(), "max_queue_depth": ctx().settings.max_queue_depth})
