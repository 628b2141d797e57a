"""``logit_bias`` keys checked against the served tokenizer, for ``/v1`` and ``/jobs`` alike.

JSON object keys are strings; the engine takes ``[[token id, bias], ...]``. A key that is
not a token id of the request's model's tokenizer (web/model_texts.py) is refused here, naming the field,
rather than failing the job on the worker. Without a prepared tokenizer only the shape is
checked (the worker checks the model's vocabulary and fails the job with a clear error).
"""
from __future__ import annotations

from typing import Any

from web.context import ctx
from web.errors import ApiError
from web.models import model_of


def vocab_size(model: str | None = None) -> int | None:
    found = ctx().budget.model(model_of(model))
    return found.vocab_size if found is not None else None


def bias_pairs(raw: dict[str, float], model: str | None = None) -> list[list[Any]]:
    """``{"id": bias}`` as ``[[id, bias], ...]``; a key that is not a token id of ``model``'s
    tokenizer (None: the web's own) is a 422 naming ``logit_bias`` (a 400 under ``/v1``,
    where validation errors are 400s)."""
    vocab = vocab_size(model)
    out = []
    for key, value in raw.items():
        if not key.isascii() or not key.isdigit() or (vocab is not None and int(key) >= vocab):
            limit = f"0..{vocab - 1}" if vocab is not None else "a non-negative integer"
            raise ApiError(422, "validation_error", f"logit_bias: key {key[:40]!r} is not a token id ({limit})",
                           field="logit_bias")
        out.append([int(key), float(value)])
    return out
