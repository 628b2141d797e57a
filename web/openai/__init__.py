"""OpenAI-compatible API (``/v1``): chat and text completions and responses through the queue,
the model list, and OpenAI's error shape for everything under ``/v1/``."""
from __future__ import annotations

from flask_openapi3 import OpenAPI

from web.openai import errors
from web.openai.batch_routes import api as batch_api
from web.openai.completion_routes import api as completion_api
from web.openai.responses_routes import api as responses_api
from web.openai.routes import api


def register(app: OpenAPI) -> None:
    app.register_api(api)
    app.register_api(batch_api)
    app.register_api(completion_api)
    app.register_api(responses_api)
    errors.install(app)
