"""The Ollama API (``/api``): chat and generate through the queue, the model catalogue, and
Ollama's error shape for everything under ``/api/``."""
from __future__ import annotations

from flask_openapi3 import OpenAPI

from web.ollama import errors
from web.ollama.catalog import api as catalog_api
from web.ollama.routes import api


def register(app: OpenAPI) -> None:
    app.register_api(api)
    app.register_api(catalog_api)
    errors.install(app)
