"""The web's half of several models per cluster: a request's ``model`` -> a model id and queue.

The answer comes from the workers' heartbeats (:func:`core.models.served`): an id a live
worker serves, or the web's own ``MINISERVE_MODEL`` before any worker served it. A request
that names no model gets the cluster's default (:meth:`core.models.Served.default`). Errors
use MiniServe's error path, so under ``/v1`` they take OpenAI's shape (web/openai/errors.py):
an unknown id is a 404 ``model_not_found``, a known one with no live worker a 503
``model_unavailable`` with ``Retry-After``.
"""
from __future__ import annotations

import time
from typing import Any

from core.model_source import model_id, model_kind
from core.models import ModelUnavailable, Served, UnknownModel, served
from core.routing import ALIVE_S
from web.context import ctx
from web.errors import ApiError

MODEL_RETRY_AFTER_S = 10  # a restarting worker beats again within seconds of starting
STARTED_AT = int(time.time())


def cluster_models() -> Served:
    """Live = a heartbeat within ``core.routing.ALIVE_S`` (three missed beats), as routing counts it."""
    settings = ctx().settings
    return served(ctx().store.client, model_id(settings.model), min(ALIVE_S, settings.worker_max_age_s),
                  settings.worker_max_age_s, own_kind=model_kind(settings.model))


def own_model_is_explicit() -> bool:
    """``MINISERVE_MODEL`` was set for the web (not the built-in default)."""
    return "model" in ctx().settings.model_fields_set


def pick_model(requested: str | None) -> tuple[str, Served]:
    """(model id, the cluster view it was checked against) for a request's ``model`` field."""
    models = cluster_models()
    wanted = requested or models.default(own_model_is_explicit())
    try:
        return models.check(wanted), models
    except UnknownModel:
        raise ApiError(404, "model_not_found", f"The model '{wanted}' does not exist; this cluster serves "
                       f"{', '.join(repr(m) for m in models.available()) or 'no model yet'}",
                       field="model") from None
    except ModelUnavailable:
        raise ApiError(503, "model_unavailable", f"The model '{wanted}' has no live worker right now; retry "
                       "later", field="model", retry_after=MODEL_RETRY_AFTER_S) from None


def model_cards() -> list[dict[str, Any]]:
    """``/v1/models``: every model a request may name now, in OpenAI's card shape."""
    return [{"id": model, "object": "model", "created": STARTED_AT, "owned_by": "miniserve"}
            for model in cluster_models().available()]
