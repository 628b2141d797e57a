"""An embedding request -> an ``embedding`` job on its model's queue -> the vectors.

Checked before anything is written: the input's shape (a string, strings, token-id lists;
none empty, at most ``MINISERVE_EMBEDDING_MAX_INPUTS`` of them, each string within
``MINISERVE_MAX_PROMPT_CHARS``) and the model (an embedding model a live worker serves:
a chat model here is a 400, as an embedding model on a chat route is). Token counts need
the model's tokenizer, which lives with the worker: an input longer than the model reads,
a token id outside its vocabulary and an unsupported ``dimensions`` end the job ``failed``
with a code this module answers as a 400 naming the field (as a grammar the worker cannot
compile is a 422). The stored request::

    {"texts": [...]} or {"token_ids": [[...], ...]}, plus "truncate", "model", "dimensions"?
"""
from __future__ import annotations

import base64
import sys
import time
from array import array
from dataclasses import dataclass
from typing import Any

from core import keys
from core.model_source import EMBEDDING
from core.models import EMBEDDING_QUEUE
from web.context import ctx
from web.errors import ApiError
from web.models import cluster_models, pick_model
from web.job_wait import finished_job
from web.submit import Submission, submit

INPUT_ERRORS = ("input_too_long", "invalid_token_id", "unsupported_dimensions")


@dataclass(frozen=True)
class Embedded:
    """A finished embedding job, as both routes answer it."""

    job_id: str
    model: str
    vectors_b64: list[str]
    prompt_tokens: int
    load_ms: float
    wall_ns: int


def inputs_of(value: Any) -> dict[str, Any]:
    """``{"texts": [...]}`` or ``{"token_ids": [[...]]}`` from a request's ``input``."""
    settings = ctx().settings
    if isinstance(value, str):
        value = [value]
    if not value:
        raise ApiError(400, "invalid_input", "input: must not be empty", field="input")
    if len(value) > settings.embedding_max_inputs:
        raise ApiError(400, "too_many_inputs", f"input: {len(value)} inputs, more than the limit of "
                       f"{settings.embedding_max_inputs} (MINISERVE_EMBEDDING_MAX_INPUTS)", field="input")
    if isinstance(value[0], int):
        value = [value]
    if isinstance(value[0], str):
        for index, text in enumerate(value):
            if not text:
                raise ApiError(400, "invalid_input", f"input[{index}]: must not be an empty string", field="input")
            if len(text) > settings.max_prompt_chars:
                raise ApiError(400, "input_too_long", f"input[{index}]: {len(text)} characters, more than "
                               f"{settings.max_prompt_chars} (MINISERVE_MAX_PROMPT_CHARS)", field="input")
        return {"texts": list(value)}
    for index, ids in enumerate(value):
        if not ids:
            raise ApiError(400, "invalid_input", f"input[{index}]: must not be an empty token list", field="input")
        if any(token < 0 for token in ids):
            raise ApiError(400, "invalid_token_id", f"input[{index}]: token ids are not negative", field="input")
    return {"token_ids": [list(ids) for ids in value]}


def embedding_model(requested: str | None) -> str:
    """The embedding model a request names (checked live), or the cluster's only one."""
    if requested is None:
        models = cluster_models()
        served = sorted(m for m in models.live if models.kind(m) == EMBEDDING)
        if len(served) != 1:
            raise ApiError(400, "model_required", "model: name the embedding model; this cluster serves "
                           f"{', '.join(repr(m) for m in served) or 'none'}", field="model")
        requested = served[0]
    model, models = pick_model(requested)
    if models.kind(model) != EMBEDDING:
        raise ApiError(400, "not_an_embedding_model", f"model: '{model}' is a chat model; embeddings need an "
                       "embedding model", field="model")
    return model


def embed(inputs: dict[str, Any], requested: str | None, truncate: bool, dimensions: int | None) -> Embedded:
    """Queue the job, wait for it, and return its vectors (input errors: 400 naming the field)."""
    began = time.perf_counter_ns()
    model = embedding_model(requested)
    request = {**inputs, "truncate": truncate, "model": model}
    if dimensions is not None:
        request["dimensions"] = dimensions
    job = submit(Submission("embedding", request, "input", model,
                            queue=keys.model_queue(EMBEDDING_QUEUE, model))).job
    try:
        result = finished_job(job.id).result or {}
    except ApiError as exc:
        raise _input_error(exc) from None
    return Embedded(job.id, str(result.get("model") or model), list(result.get("embeddings") or []),
                    int((result.get("usage") or {}).get("prompt_tokens") or 0),
                    float((result.get("timings") or {}).get("load_ms") or 0.0), time.perf_counter_ns() - began)


def _input_error(exc: ApiError) -> ApiError:
    """A failed job whose code says the request was at fault: a 400 naming its field."""
    if exc.code not in INPUT_ERRORS or exc.job_id is None:
        return exc
    error = ctx().store.get(exc.job_id).error or {}
    return ApiError(400, exc.code, exc.message, field=str(error.get("field") or "input"), job_id=exc.job_id)


def floats(vector_b64: str) -> list[float]:
    """A stored vector (base64 of little-endian float32) as JSON numbers."""
    values = array("f")
    values.frombytes(base64.b64decode(vector_b64))
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()
