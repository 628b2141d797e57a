"""Every error the web answers, as JSON ``{"error": {"code", "message", "field"?}}``, in one place.

Routes raise :class:`ApiError` (or let Redis / pydantic errors propagate); the handlers
registered by :func:`install_error_handlers` turn them, and any other exception, into JSON
with the right status. No request ever gets an HTML error page.
"""
from __future__ import annotations

import logging
import re
from typing import Any

import redis
from flask import Flask, Response, jsonify
from kombu.exceptions import OperationalError as BrokerError
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from core.keys import InvalidJobId
from core.logs import log_event

logger = logging.getLogger("miniserve.web")
REDIS_RETRY_AFTER_S = 5
_FIELD_IN_MESSAGE = re.compile(r"^(?:Value error, )?([a-z_]+): (.*)$", re.S)
# Pydantic puts the union member it tried into the location ("stop.list[constrained-str]");
# clients want the field, so those tags are dropped.
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "constrained-str",
                         "constrained-int", "constrained-float"})


def _is_union_tag(part: str) -> bool:
    return part in _UNION_TAGS or "[" in part


class ApiError(Exception):
    """An error a client can act on, with its HTTP status."""

    def __init__(self, status: int, code: str, message: str, *, field: str | None = None,
                 retry_after: int | None = None, extra: dict[str, Any] | None = None,
                 job_id: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.field, self.retry_after, self.extra, self.job_id = field, retry_after, extra or {}, job_id
        self.headers = headers or {}


def error_response(status: int, code: str, message: str, *, field: str | None = None,
                   details: list[dict[str, str]] | None = None, retry_after: int | None = None,
                   job_id: str | None = None, extra: dict[str, Any] | None = None) -> Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    if details:
        body["details"] = details
    if job_id is not None:
        body["job_id"] = job_id
    response = jsonify({"error": body, **(extra or {})})
    response.status_code = status
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    return response


def validation_details(exc: ValidationError) -> list[dict[str, str]]:
    """One ``{field, message}`` per pydantic error; model-level errors name their field
    as ``"field: message"`` (see :mod:`web.schemas`)."""
    details = []
    for error in exc.errors(include_url=False):
        loc = [str(part) for part in error.get("loc", ()) if not _is_union_tag(str(part))]
        message = str(error.get("msg", "invalid"))
        match = _FIELD_IN_MESSAGE.match(message)
        if not loc and match:
            loc, message = [match.group(1)], match.group(2)
        if error.get("type") == "extra_forbidden":
            message = "unknown field"
        detail = {"field": ".".join(loc) or "body", "message": message}
        if detail not in details:
            details.append(detail)
    return details


def validation_error_response(exc: ValidationError) -> Response:
    """flask-openapi3's ``validation_error_callback``: 422 naming the field(s)."""
    details = validation_details(exc)
    first = details[0] if details else {"field": "body", "message": "invalid"}
    return error_response(422, "validation_error", f"{first['field']}: {first['message']}",
                          field=first["field"], details=details)


def _api_error(exc: ApiError) -> Response:
    response = error_response(exc.status, exc.code, exc.message, field=exc.field,
                              retry_after=exc.retry_after, job_id=exc.job_id, extra=exc.extra)
    response.headers.update(exc.headers)
    return response


def _http_error(exc: HTTPException) -> Response:
    if exc.response is not None:  # already a full response (flask-openapi3 validation abort)
        return exc.response
    code = re.sub(r"[^a-z]+", "_", (exc.name or "error").lower()).strip("_")
    response = error_response(exc.code or 500, code, exc.description or exc.name or "error")
    if exc.code == 405 and hasattr(exc, "valid_methods") and exc.valid_methods:
        response.headers["Allow"] = ", ".join(exc.valid_methods)
    return response


def _redis_down(exc: Exception) -> Response:
    log_event(logger, "redis_unavailable", level=logging.WARNING, exc_type=type(exc).__name__)
    return error_response(503, "redis_unavailable",
                          "the job store (Redis) is unreachable; retry shortly",
                          retry_after=REDIS_RETRY_AFTER_S)


def _redis_full(exc: Exception) -> Response:
    """Redis at its ``maxmemory`` with ``noeviction`` refuses writes: the service is full, not
    broken; nothing stored is evicted, and the client retries later."""
    log_event(logger, "redis_full", level=logging.WARNING, exc_type=type(exc).__name__)
    return error_response(503, "store_full", "the job store (Redis) is full; retry later",
                          retry_after=REDIS_RETRY_AFTER_S)


def _not_a_job_id(exc: InvalidJobId) -> Response:
    """A backstop: routes turn ids of the wrong shape into 404s themselves (``find_job``)."""
    return error_response(404, "job_not_found", "no such job")


def _unexpected(exc: Exception) -> Response:
    logger.error("unhandled_error", exc_info=exc, extra={"exc_type": type(exc).__name__})
    return error_response(500, "internal_error", "internal error (logged)")


def install_error_handlers(app: Flask) -> None:
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(ValidationError, validation_error_response)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(InvalidJobId, _not_a_job_id)
    app.register_error_handler(redis.ConnectionError, _redis_down)
    app.register_error_handler(redis.TimeoutError, _redis_down)
    app.register_error_handler(redis.exceptions.OutOfMemoryError, _redis_full)
    app.register_error_handler(BrokerError, _redis_down)  # kombu's wrapper for a lost broker
    app.register_error_handler(Exception, _unexpected)
