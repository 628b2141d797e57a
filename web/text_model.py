"""The text side (tokenizer, chat template, context) of the model a request names, as the
web holds it: shared by ``/tokenize`` and the surfaces that count or render a prompt. A
model this cluster does not know is a 404 ``model_not_found``; one known but whose tokenizer
is not here yet, a 503 ``tokenizer_unavailable``."""
from __future__ import annotations

from core.models import ModelUnavailable, UnknownModel
from web.context import ctx
from web.errors import ApiError
from web.model_texts import TextModel
from web.models import cluster_models, own_model_is_explicit


def text_model(requested: str | None) -> TextModel:
    """The named model's text side (default: the cluster's default model)."""
    models = cluster_models()
    try:
        name = models.resolve(requested, own_model_is_explicit())
    except ModelUnavailable as exc:
        name = exc.args[0]  # a known model: its published tokenizer still counts
    except UnknownModel:
        raise ApiError(404, "model_not_found", f"The model '{requested}' does not exist; this cluster serves "
                       f"{', '.join(repr(m) for m in models.available()) or 'no model yet'}", field="model") from None
    found = ctx().budget.model(name)
    if found is not None:
        return found
    raise ApiError(503, "tokenizer_unavailable", f"the tokenizer of '{name}' is not here yet (its worker "
                   "publishes it once its model has loaded)", retry_after=5)
