"""``/health``: readiness, for load balancers and Kubernetes readiness probes.

``/healthz`` answers whether the web and its Redis are up (liveness). ``/health`` answers
whether a request sent now can be served: 200 only when at least one worker whose
heartbeat is fresh (``worker_max_age_s``) reports its model loaded, else 503 with a reason,
so a balancer sends no traffic to a stack whose workers are still loading the model. A model
that failed to load is a reason of its own (``model_failed``, with each worker's error), so an
operator tells a stack that will never be ready from one that is still starting.
"""
from __future__ import annotations

from typing import Any, Literal

import redis
from flask import Response, jsonify
from flask_openapi3 import APIBlueprint, Tag
from pydantic import BaseModel

from core.workers import list_workers
from web.context import ctx

api = APIBlueprint("health", __name__, abp_tags=[Tag(name="system", description="service status")])
RETRY_AFTER_S = "5"
REASONS = {
    "redis_unavailable": "Redis does not answer",
    "no_workers": "no worker has sent a heartbeat recently",
    "model_not_loaded": "workers are up but none has its model loaded yet",
    "model_failed": "workers are up but their model failed to load: see load_errors",
}


class ReadinessResponse(BaseModel):
    status: Literal["ready", "not_ready"]
    reason: Literal["redis_unavailable", "no_workers", "model_not_loaded", "model_failed"] | None = None
    message: str | None = None
    workers: int
    ready_workers: int
    models: list[str]
    load_errors: list[dict[str, str]] = []  # {"model", "error"} of each model that failed to load


@api.get("/health", summary="Ready: a live worker has its model loaded (no key needed)",
         responses={200: ReadinessResponse, 503: ReadinessResponse}, openapi_extensions={"security": []})
def health():
    try:
        workers = list_workers(ctx().store.client, ctx().settings.worker_max_age_s)
    except (redis.ConnectionError, redis.TimeoutError):
        return _not_ready("redis_unavailable", 0)
    ready = [w for w in workers if w["info"].get("engine_loaded") is True]
    if not ready:
        failed = _load_errors(workers)
        loading = any(not w["info"].get("load_error") for w in workers)
        reason = "no_workers" if not workers else "model_not_loaded" if loading or not failed else "model_failed"
        return _not_ready(reason, len(workers), failed)
    return jsonify({"status": "ready", "reason": None, "message": None, "workers": len(workers),
                    "ready_workers": len(ready), "models": _models(ready)})


def _models(workers: list[dict[str, Any]]) -> list[str]:
    return sorted({str(w["info"].get("model")) for w in workers if w["info"].get("model")})


def _load_errors(workers: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Each distinct (model, error) the workers report; no worker names or hosts (no key needed here)."""
    seen = {(str(w["info"].get("model") or ""), str(w["info"]["load_error"]))
            for w in workers if w["info"].get("load_error")}
    return [{"model": model, "error": error} for model, error in sorted(seen)]


def _not_ready(reason: str, workers: int, load_errors: list[dict[str, str]] | None = None) -> Response:
    response = jsonify({"status": "not_ready", "reason": reason, "message": REASONS[reason],
                        "workers": workers, "ready_workers": 0, "models": [], "load_errors": load_errors or []})
    response.status_code = 503
    response.headers["Retry-After"] = RETRY_AFTER_S
    return response
