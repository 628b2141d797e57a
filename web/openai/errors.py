"""OpenAI's error shape for every ``/v1`` answer, from MiniServe's one error path.

Routes, guards and validation all raise or answer MiniServe errors (``web.errors``); one
``after_request`` hook rewrites those under ``/v1/`` into
``{"error": {"message", "type", "param", "code"}}``. A body that fails validation is a
400 here (OpenAI's status for an invalid request), not MiniServe's 422.
"""
from __future__ import annotations

import json
from typing import Any

from flask import Flask, Response, request

PREFIX = "/v1/"
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
               413: "invalid_request_error", 415: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error", 503: "service_unavailable_error", 504: "timeout_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def openai_error(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """MiniServe's ``{"error": {"code", "message", "field", ...}}`` as OpenAI's shape."""
    error = body.get("error") or {}
    return {"error": {"message": str(error.get("message", "error")), "type": error_type(status),
                      "param": error.get("field"), "code": error.get("code")}}


def _reshape(response: Response) -> Response:
    if not request.path.startswith(PREFIX) or response.status_code < 400 or not response.is_json:
        return response
    body = response.get_json(silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict) or "type" in body["error"]:
        return response
    status = 400 if response.status_code == 422 else response.status_code
    if body["error"].get("job_id"):
        response.headers["X-Job-Id"] = str(body["error"]["job_id"])
    response.set_data(json.dumps(openai_error(response.status_code, body), ensure_ascii=False))
    response.status_code = status
    return response


def install(app: Flask) -> None:
    app.after_request(_reshape)
