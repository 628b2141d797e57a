"""The Flask application factory: ``create_app(settings, store, celery_client)``.

Route groups live in their own modules and are listed in :data:`API_MODULES`. Other
parts of the front end (the OpenAI-compatible API, the monitor page, metrics) plug in
the same way: a module exposing ``register(app)``, listed in :data:`EXTENSION_MODULES`.
"""
from __future__ import annotations

import importlib
from typing import Any

from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from flask import render_template_string
from flask_openapi3 import Info, OpenAPI
from flask_openapi3_swagger.templates import swagger_html_string

from core.jobs import JobStore
from core.redis_conn import redis_client
from core.settings import Settings, get_settings
from web.celery_client import make_celery_client
from web.context import EXTENSION_KEY, WebContext
from web.errors import install_error_handlers, validation_error_response
from web.feeds import FeedHub
from web.guards import install_guards
from web.openapi_doc import MiniServeOpenAPI
from web.prompt_budget import PromptBudget
from web.request_log import install_request_log
from web.schemas import ErrorResponse
from web.sse import format_event

API_VERSION = "0.1.0"
REDIS_SPARE_CONNECTIONS = 64  # the pool's room beyond one connection per HTTP connection
API_MODULES = ("web.routes_jobs", "web.routes_compat", "web.routes_bench", "web.routes_system",
               "web.routes_health", "web.routes_tokenize", "web.routes_webhooks")
# Modules exposing ``register(app: OpenAPI) -> None`` (``app.register_api(api)`` for an
# APIBlueprint, ``app.register_blueprint(bp)`` for a plain one). Add yours here, e.g.
# "web.openai_api", "web.monitor", "web.metrics".
EXTENSION_MODULES: tuple[str, ...] = ("web.openai", "web.anthropic", "web.ollama", "web.metrics", "web.monitor",
                                     "web.routing", "web.playground", "web.embeddings")


def make_store(settings: Settings) -> JobStore:
    """A JobStore on a pooled Redis client. Reads may block for an SSE keep-alive tick;
    a lost connection is retried twice within ~0.3 s, then the request gets a 503
    (redis-py's default backoff would hold it for seconds). The pool may grow to one
    connection per open HTTP connection (an SSE stream holds one while it waits in
    ``XREAD``; redis-py's default cap of 100 made the 101st stream a 503)."""
    client = redis_client(settings, decode_responses=True, socket_connect_timeout=2,
                          max_connections=settings.web_connections + REDIS_SPARE_CONNECTIONS,
                          socket_timeout=settings.sse_keepalive_s + 10, health_check_interval=30,
                          retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), 2))
    return JobStore(client, ttl_s=settings.job_ttl_s)


def warm_up(app: Any) -> None:
    """Load the tokenizer and chat template before the first request. Under the gevent
    worker, a load inside a request (seen: the first ``POST /jobs`` of a process) holds the
    hub, so every stream of that process waits for it; done here, it delays only the boot."""
    app.extensions[EXTENSION_KEY].budget.warm_up()


def create_app(settings: Settings | None = None, store: JobStore | None = None,
               celery_client: Any = None) -> OpenAPI:
    settings = settings or get_settings()
    app = MiniServeOpenAPI(
        __name__,
        settings=settings,
        info=Info(title="MiniServe", version=API_VERSION,
                  description="LLM inference jobs on a Redis queue, run by Celery workers."),
        doc_prefix="",
        doc_url="/openapi.json",
        validation_error_status=422,
        validation_error_model=ErrorResponse,
        validation_error_callback=validation_error_response,
        **_security(settings),
    )
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    app.json.sort_keys = False  # type: ignore[attr-defined]
    store = store or make_store(settings)
    app.extensions[EXTENSION_KEY] = WebContext(
        settings=settings,
        store=store,
        celery=celery_client or make_celery_client(settings),
        budget=PromptBudget.from_settings(settings, store.client),
        feeds=FeedHub(store, format_event),
    )
    install_request_log(app)
    install_guards(app, settings.max_body_bytes)
    install_error_handlers(app)
    for module_name in API_MODULES:
        app.register_api(importlib.import_module(module_name).api)
    for module_name in EXTENSION_MODULES:
        importlib.import_module(module_name).register(app)
    app.add_url_rule("/docs", "docs", _swagger_page)
    return app


def _security(settings: Settings) -> dict[str, Any]:
    """With API keys configured, the document says every operation needs a key, as a bearer
    token or in ``x-api-key`` (Anthropic's clients; ``/healthz`` opts out)."""
    if not settings.api_keys:
        return {}
    return {"security_schemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                 "x_api_key": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
            "openapi_extensions": {"security": [{"bearer": []}, {"x_api_key": []}]}}


def _swagger_page() -> str:
    """Swagger UI at ``/docs``; its assets come from the flask-openapi3-swagger package
    (served under ``/swagger/``), so the page works offline."""
    return render_template_string(swagger_html_string, doc_url="openapi.json", swagger_config=None,
                                  oauth_config=None)
