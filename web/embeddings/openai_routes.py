"""``POST /v1/embeddings``: OpenAI's embeddings endpoint, through the queue.

The answer is OpenAI's list of ``embedding`` objects in input order, each vector as JSON
numbers or (``encoding_format: base64``) as base64 of little-endian float32; ``usage``
counts the tokens the model read (special tokens included). Errors take OpenAI's shape
(web/openai/errors.py); ``X-Job-Id`` names the job.
"""
from __future__ import annotations

import logging
from typing import Any

from flask import jsonify
from flask_openapi3 import APIBlueprint, Tag

from core.logs import log_event
from web.embeddings.schemas import EmbeddingList, EmbeddingRequest
from web.embeddings.submit import embed, floats, inputs_of
from web.openai.schemas import OpenAIError

logger = logging.getLogger("miniserve.web.embeddings")
api = APIBlueprint("openai_embeddings", __name__, url_prefix="/v1",
                   abp_tags=[Tag(name="openai", description="OpenAI-compatible API (through the queue)")])
ERRORS: dict[int, Any] = {code: OpenAIError for code in (400, 401, 404, 409, 413, 415, 429, 500, 503, 504)}


@api.post("/embeddings", summary="Embeddings (OpenAI-compatible) from an embedding model",
          responses={200: EmbeddingList, **ERRORS})
def embeddings(body: EmbeddingRequest):
    """Runs as an ``embedding`` job on the model's embedding workers; inputs of concurrent
    requests share forwards there. ``dimensions`` other than the model's size is a 400."""
    inputs = inputs_of(body.input)
    done = embed(inputs, body.model, truncate=False, dimensions=body.dimensions)
    log_event(logger, "embeddings_done", job_id=done.job_id, inputs=len(done.vectors_b64),
              prompt_tokens=done.prompt_tokens, latency_ms=round(done.wall_ns / 1e6, 1))
    as_base64 = body.encoding_format == "base64"
    data = [{"object": "embedding", "index": index, "embedding": vector if as_base64 else floats(vector)}
            for index, vector in enumerate(done.vectors_b64)]
    response = jsonify({"object": "list", "data": data, "model": done.model,
                        "usage": {"prompt_tokens": done.prompt_tokens, "total_tokens": done.prompt_tokens}})
    response.headers["X-Job-Id"] = done.job_id
    return response
