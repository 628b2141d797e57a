"""Ollama's error shape for everything under ``/api/``: ``{"error": "<message>"}``.

Routes, guards and validation raise or answer MiniServe errors (``web.errors``); one
``after_request`` hook rewrites those under ``/api/`` into Ollama's shape, the message
naming the field (``options.mirostat: not supported ...``). A body that fails validation is
a 400, Ollama's status for a bad request, not MiniServe's 422. ``Retry-After`` and
``X-Job-Id`` headers stay.
"""
from __future__ import annotations

import json
import re

from flask import Flask, Response, request

PREFIX = "/api/"


def ollama_message(error: dict) -> str:
    """The error's message, starting with the field it names (unless it starts with that
    field or one inside it already: ``options.mirostat: ...``)."""
    message, field = str(error.get("message") or error.get("code") or "error"), error.get("field")
    if field and field != "body":
        inner = message.removeprefix(f"{field}: ").removeprefix("Value error, ")
        message = inner if re.match(rf"{re.escape(field)}[.\w]*: ", inner) else f"{field}: {inner}"
    return message


def _reshape(response: Response) -> Response:
    if not request.path.startswith(PREFIX) or response.status_code < 400 or not response.is_json:
        return response
    body = response.get_json(silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return response
    if body["error"].get("job_id"):
        response.headers["X-Job-Id"] = str(body["error"]["job_id"])
    response.set_data(json.dumps({"error": ollama_message(body["error"])}, ensure_ascii=False))
    response.status_code = 400 if response.status_code == 422 else response.status_code
    return response


def install(app: Flask) -> None:
    app.after_request(_reshape)
