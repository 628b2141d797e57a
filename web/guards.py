"""Checks that run before any route: API keys, per-key rate limits, and the body's
size, content type, completeness, JSON syntax, nesting depth and text (:mod:`web.body`), so
routes only ever see a parsed JSON object that nothing downstream can overflow the stack
on or fail to encode.

A key comes as ``Authorization: Bearer <key>`` or as ``x-api-key: <key>``. Public without a
key: ``/healthz``, ``/health`` and the documentation (``/``, ``/docs``, ``/openapi.json``,
Swagger UI assets under ``/swagger``): they describe the API and hold no job data.
"""
from __future__ import annotations

import hmac

from flask import Flask, current_app, g, request

from core.limits import over_rate_limit
from core.owners import owner_id  # noqa: F401 - the web's name for it (tests import it from here)
from web.body import CheckedRequest, load_body, read_body
from web.context import ctx
from web.errors import ApiError

PUBLIC_PATHS = frozenset({"/", "/healthz", "/health", "/docs", "/openapi.json"})
PUBLIC_PREFIXES = ("/swagger/", "/swagger", "/static/")
EXTRA_PUBLIC_CONFIG = "MINISERVE_PUBLIC_PREFIXES"
JSON_TYPES = ("application/json",)
MULTIPART_PATHS = frozenset({"/v1/files"})  # file uploads: multipart, up to max_file_bytes
MULTIPART_SLACK_BYTES = 64 * 1024  # the form's other parts and boundaries around the file
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def is_public(path: str) -> bool:
    extra = tuple(current_app.config.get(EXTRA_PUBLIC_CONFIG, ()))
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES + extra)


def add_public_prefix(app: Flask, prefix: str) -> None:
    """Let an extension serve pages without an API key (e.g. static assets of a monitor page)."""
    app.config[EXTRA_PUBLIC_CONFIG] = (*app.config.get(EXTRA_PUBLIC_CONFIG, ()), prefix)


def _authenticate() -> None:
    settings = ctx().settings
    api_keys = settings.api_keys + settings.admin_api_keys
    g.owner = None
    g.admin = not api_keys  # no keys configured: everyone is one key, and sees everything
    g.rate_id = f"ip:{request.remote_addr or '-'}"
    if not api_keys:
        return
    token = _presented_key()
    if not token or not _one_of(token, api_keys):
        raise ApiError(401, "unauthorized", "a valid 'Authorization: Bearer <key>' (or 'x-api-key: <key>') "
                       "header is required", headers={"WWW-Authenticate": "Bearer"})
    g.owner = g.rate_id = owner_id(token)
    g.admin = _one_of(token, settings.admin_api_keys)


def _one_of(token: str, keys: list[str]) -> bool:
    """Constant-time membership (every key compared, whatever matches)."""
    return any([hmac.compare_digest(token.encode(), key.encode()) for key in keys])


def is_admin() -> bool:
    """Whether this request's key may see operators' details (hosts, paths, other keys' jobs)."""
    return bool(g.get("admin", False))


def _presented_key() -> str:
    """The key of ``Authorization: Bearer <key>`` or, when there is no ``Authorization``
    header, of ``x-api-key`` (Anthropic's clients send that one): the same key either way, so
    the same owner and rate limit. An ``Authorization`` header decides alone: a bad one is
    not rescued by another header."""
    header = request.headers.get("Authorization")
    if header is None:
        return request.headers.get("X-Api-Key", "").strip()
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _rate_limit() -> None:
    limit = ctx().settings.rate_limit_per_minute
    if limit <= 0:
        return
    retry = over_rate_limit(ctx().store.client, g.rate_id, limit)
    if retry is not None:
        raise ApiError(429, "rate_limited", f"more than {limit} requests per minute for this key",
                       retry_after=retry)


def _check_body() -> None:
    if request.method not in BODY_METHODS:
        return
    length = request.content_length
    chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    if not length and not chunked:
        return  # no body: routes that need one answer 422
    settings = ctx().settings
    upload = request.mimetype == "multipart/form-data" and request.path in MULTIPART_PATHS
    limit = settings.max_file_bytes + MULTIPART_SLACK_BYTES if upload else settings.max_body_bytes
    if length is not None and length > limit:
        raise ApiError(413, "body_too_large", f"request body over {limit} bytes")
    if not upload and request.mimetype not in JSON_TYPES and not request.mimetype.endswith("+json"):
        raise ApiError(415, "unsupported_media_type", "send the body as 'Content-Type: application/json'")
    data = read_body(request.environ, length, limit, settings.body_timeout_s, settings.body_deadline_s)
    if upload:
        request.max_content_length = limit  # werkzeug parses the form from the bytes read above
        return
    load_body(request, data)


def install_guards(app: Flask, max_body_bytes: int) -> None:
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.request_class = CheckedRequest  # routes get the body the guard parsed (web.body)

    @app.before_request
    def _guard() -> None:
        g.owner = None
        g.admin = False
        if is_public(request.path):
            return
        _authenticate()
        _rate_limit()
        _check_body()
