"""Embeddings: ``POST /v1/embeddings`` (OpenAI's shape) and ``POST /api/embed`` (Ollama's),
both served by embedding workers through the queue (an ``embedding`` job per request)."""
from __future__ import annotations

from flask_openapi3 import OpenAPI

from web.embeddings import ollama_routes, openai_routes


def register(app: OpenAPI) -> None:
    app.register_api(openai_routes.api)
    app.register_api(ollama_routes.api)
    ollama_routes.install_error_shape(app)
