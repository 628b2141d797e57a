"""The web's half of several models per cluster: a request's ``model`` -> a model id and queue.

The answer comes from the workers' heartbeats (:func:`core.models.served`): an id a live
worker serves, or the web's own ``MINISERVE_MODEL`` before any worker served it. Names are
resolved by :meth:`core.models.Served.resolve` (ids, aliases, ``name:latest``, the only
model on offer for any name). Errors
use MiniServe's error path, so under ``/v1`` they take OpenAI's shape (web/openai/errors.py):
an unknown id is a 404 ``model_not_found``, a known one with no live worker a 503
``model_unavailable`` with ``Retry-After``.
"""
from __future__ import annotations

import time
from typing import Any

from flask import g

from core.model_source import model_aliases, model_id, model_kind
from core.models import CHAT, ModelUnavailable, Served, UnknownModel, served
from core.routing import ALIVE_S
from web.context import ctx
from web.errors import ApiError

MODEL_RETRY_AFTER_S = 10  # a restarting worker beats again within seconds of starting
VIEW_REUSE_S = 1.0  # a second-old view of heartbeats that come every 5 s
_clock = time.monotonic  # a test steps its own
STARTED_AT = int(time.time())


def cluster_models() -> Served:
    """Live = a heartbeat within ``core.routing.ALIVE_S`` (three missed beats), as routing counts it.

    A caller that submits many jobs in one app context (a batch's intake) opts in to reusing a
    view for :data:`VIEW_REUSE_S` with :func:`reuse_cluster_views`: three Redis round trips
    a line were a quarter of a line's intake. A request always reads a fresh one."""
    held = g.get("cluster_view")
    if held is not None and held[1] is not None and _clock() - held[0] < VIEW_REUSE_S:
        return held[1]
    view = _read_cluster_models()
    if held is not None:
        g.cluster_view = (_clock(), view)
    return view


def reuse_cluster_views() -> None:
    """From now on in this app context, :func:`cluster_models` reuses its view for a while."""
    g.cluster_view = (0.0, None)


def _read_cluster_models() -> Served:
    settings = ctx().settings
    return served(ctx().store.client, model_id(settings.model), min(ALIVE_S, settings.worker_max_age_s),
                  settings.worker_max_age_s, own_aliases=model_aliases(settings),
                  own_kind=model_kind(settings.model))


def own_model_is_explicit() -> bool:
    """``MINISERVE_MODEL`` was set for the web (not the built-in default)."""
    return "model" in ctx().settings.model_fields_set


def pick_model(requested: str | None, kind: str = CHAT) -> tuple[str, Served]:
    """(model id, the cluster view it was checked against) for a request's ``model`` field;
    404 ``model_not_found`` / 503 ``model_unavailable`` (field ``model``) otherwise."""
    models = cluster_models()
    try:
        return models.resolve(requested, own_model_is_explicit(), kind), models
    except UnknownModel:
        raise ApiError(404, "model_not_found", f"The model '{requested}' does not exist; this cluster serves "
                       f"{', '.join(repr(m) for m in models.available(kind)) or 'no model yet'}",
                       field="model") from None
    except ModelUnavailable as exc:
        raise ApiError(503, "model_unavailable", f"The model '{exc.args[0]}' has no live worker right now; "
                       "retry later", field="model", retry_after=MODEL_RETRY_AFTER_S) from None


def model_of(requested: str | None) -> str | None:
    """The id a request's ``model`` resolves to, for checks made before the job is submitted
    (a tokenizer's FIM tokens, ``logit_bias`` ids); ``None`` (the web's own) when it does not
    resolve: the submission then answers the 404 / 503 itself."""
    try:
        return cluster_models().resolve(requested, own_model_is_explicit())
    except (UnknownModel, ModelUnavailable):
        return None


def model_cards() -> list[dict[str, Any]]:
    """``/v1/models``: every model a request may name now, in OpenAI's card shape plus the
    other names it answers to (``aliases``)."""
    models = cluster_models()
    return [{"id": model, "object": "model", "created": STARTED_AT, "owned_by": "miniserve",
             "aliases": models.names(model)} for model in models.available()]


def model_card(requested: str) -> dict[str, Any]:
    """``/v1/models/{id}``: the card of the model ``requested`` names (an id or any name
    :meth:`core.models.Served.resolve` accepts); 404 / 503 as :func:`pick_model`."""
    model, _ = pick_model(requested)
    return next(card for card in model_cards() if card["id"] == model)
