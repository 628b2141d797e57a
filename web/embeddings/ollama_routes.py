"""``POST /api/embed``: Ollama's embedding endpoint, on the same embedding workers.

Ollama truncates inputs longer than the model reads unless ``truncate`` is false (then a
400, as ``/v1/embeddings`` always answers). Errors take Ollama's shape, ``{"error":
"message"}``, with 400 where MiniServe says 422 (:func:`install_error_shape`, for this path
only: the rest of the Ollama API brings its own).
"""
from __future__ import annotations

import json
from typing import Any

from flask import Flask, Response, jsonify, request
from flask_openapi3 import APIBlueprint, Tag

from web.embeddings.schemas import OllamaEmbedRequest, OllamaEmbedResponse, OllamaError
from web.embeddings.submit import embed, floats, inputs_of
from web.errors import ApiError

PATHS = ("/api/embed",)
api = APIBlueprint("ollama_embed", __name__, abp_tags=[Tag(name="ollama", description="Ollama-compatible API")])
ERRORS: dict[int, Any] = {code: OllamaError for code in (400, 401, 404, 409, 413, 429, 500, 503, 504)}


@api.post("/api/embed", summary="Embeddings (Ollama-compatible)", responses={200: OllamaEmbedResponse, **ERRORS})
def ollama_embed(body: OllamaEmbedRequest):
    if body.options:
        name = sorted(body.options)[0]
        raise ApiError(400, "unsupported_option", f"options.{name}: no option applies to embeddings here",
                       field=f"options.{name}")
    done = embed(inputs_of(body.input), body.model, truncate=body.truncate, dimensions=body.dimensions)
    response = jsonify({"model": done.model, "embeddings": [floats(v) for v in done.vectors_b64],
                        "total_duration": done.wall_ns, "load_duration": int(done.load_ms * 1e6),
                        "prompt_eval_count": done.prompt_tokens})
    response.headers["X-Job-Id"] = done.job_id
    return response


def _reshape(response: Response) -> Response:
    """MiniServe's ``{"error": {...}}`` as Ollama's ``{"error": "message"}``."""
    if request.path not in PATHS or response.status_code < 400 or not response.is_json:
        return response
    body = response.get_json(silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return response
    response.set_data(json.dumps({"error": str(body["error"].get("message") or "error")}, ensure_ascii=False))
    if response.status_code == 422:
        response.status_code = 400
    return response


def install_error_shape(app: Flask) -> None:
    app.after_request(_reshape)
