"""Anthropic's error shape for ``/v1/messages`` and everything under it, from MiniServe's one
error path.

Routes, guards and validation raise or answer MiniServe errors (``web.errors``); one
``after_request`` hook rewrites those on these paths into
``{"type": "error", "error": {"type", "message"}}``, Anthropic's types by status. A body
that fails validation is a 400 here (Anthropic's status for an invalid request), not
MiniServe's 422. The hook runs before ``web.openai.errors``' (registered after it), which
leaves an error that already has a ``type`` alone.
"""
from __future__ import annotations

import json
from typing import Any

from flask import Flask, Response, request

PATH = "/v1/messages"
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "api_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error", 504: "timeout_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _ours(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


def _reshape(response: Response) -> Response:
    if not _ours(request.path) or response.status_code < 400 or not response.is_json:
        return response
    body = response.get_json(silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict) or body.get("type") == "error":
        return response
    status = 400 if response.status_code == 422 else response.status_code
    error = body["error"]
    if error.get("job_id"):
        response.headers["X-Job-Id"] = str(error["job_id"])
    response.set_data(json.dumps(error_body(error_type(status), str(error.get("message", "error"))),
                                 ensure_ascii=False))
    response.status_code = status
    return response


def install(app: Flask) -> None:
    app.after_request(_reshape)
