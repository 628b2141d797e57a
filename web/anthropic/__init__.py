"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) on the same
queue, chat path and engine as ``/v1/chat/completions``, with Anthropic's error shape."""
from __future__ import annotations

from flask_openapi3 import OpenAPI

from web.anthropic import errors
from web.anthropic.routes import api


def register(app: OpenAPI) -> None:
    """Register after ``web.openai``: this error hook must run before OpenAI's (see errors.py)."""
    app.register_api(api)
    errors.install(app)
