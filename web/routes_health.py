"""``/health``: readiness, for load balancers and Kubernetes readiness probes.

``/healthz`` answers whether the web and its Redis are up (liveness). ``/health`` answers
whether a request sent now can be served: 200 only when at least one worker whose
heartbeat is fresh (``worker_max_age_s``) reports its model loaded, else 503 with a reason,
so a balancer sends no traffic to a stack whose workers are still loading the model.
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
}


class ReadinessResponse(BaseModel):
    status: Literal["ready", "not_ready"]
    reason: Literal["redis_unavailable", "no_workers", "model_not_loaded"] | None = None
    message: str | None = None
    workers: int
    ready_workers: int
    models: list[str]


@api.get("/health", summary="Ready: a live worker has its model loaded (no key needed)",
         responses={200: ReadinessResponse, 503: ReadinessResponse}, openapi_extensions={"security": []})
def health():
    try:
        workers = list_workers(ctx().store.client, ctx().settings.worker_max_age_s)
    except (redis.ConnectionError, redis.TimeoutError):
        return _not_ready("redis_unavailable", 0)
    ready = [w for w in workers if w["info"].get("engine_loaded") is True]
    if not ready:
        return _not_ready("no_workers" if not workers else "model_not_loaded", len(workers))
    return jsonify({"status": "ready", "reason": None, "message": None, "workers": len(workers),
                    "ready_workers": len(ready), "models": _models(ready)})


def _models(workers: list[dict[str, Any]]) -> list[str]:
    return sorted({str(w["info"].get("model")) for w in workers if w["info"].get("model")})


def _not_ready(reason: str, workers: int) -> Response:
    response = jsonify({"status": "not_ready", "reason": reason, "message": REASONS[reason],
                        "workers": workers, "ready_workers": 0, "models": []})
    response.status_code = 503
    response.headers["Retry-After"] = RETRY_AFTER_S
    return response
