"""``options.num_ctx``, checked: the prompt and ``num_predict`` must fit in it.

Ollama runs a model with a context window of ``num_ctx`` tokens and drops the oldest prompt
tokens that do not fit. MiniServe's window is the model's own, so a request whose prompt
(counted with the model's tokenizer and chat template, as the prompt-length check counts
it: web/prompt_text.py) plus ``num_predict`` fits in ``num_ctx`` runs exactly as Ollama
would run it, and one that does not is a 400 naming ``options.num_ctx`` instead of an
answer to a cut prompt. A ``num_ctx`` above the model's context changes nothing: the
model's own limit is checked when the job is submitted.
"""
from __future__ import annotations

from typing import Any

from web import prompt_text
from web.context import ctx
from web.errors import ApiError
from web.models import model_of

FIELD = "options.num_ctx"


def check_num_ctx(num_ctx: int, request: dict[str, Any], requested_model: str | None) -> None:
    """Raise a 400 naming ``options.num_ctx`` when ``request`` (a stored chat or completion
    job request) needs more tokens than ``num_ctx``."""
    if num_ctx < 1:
        raise ApiError(400, "validation_error", f"{FIELD}: at least 1", field=FIELD)
    model = ctx().budget.model(model_of(requested_model))
    if model is None:
        raise ApiError(503, "tokenizer_unavailable", f"{FIELD}: the model's tokenizer is not here yet, so the "
                       "prompt cannot be checked against num_ctx; retry shortly or leave num_ctx out",
                       field=FIELD, retry_after=5)
    max_new = int(request["sampling"]["max_new_tokens"])
    prompts = request.get("prompts")
    parts = [{"raw_prompt": text} for text in prompts] if prompts else [request]
    for part in parts:
        tokens = prompt_text.count(model, part).tokens
        if tokens + max_new > num_ctx:
            raise ApiError(400, "context_exceeded", f"{FIELD}: {tokens} prompt tokens + {max_new} to generate "
                           f"(num_predict) need more than num_ctx {num_ctx}; raise num_ctx or lower num_predict "
                           "(MiniServe does not cut the prompt)", field=FIELD)
