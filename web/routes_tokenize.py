"""``POST /tokenize`` and ``POST /detokenize``, in vLLM's request and response shapes.

``model`` picks whose tokenizer (default: the model a request naming none would get): the
web holds each model's ``tokenizer.json`` and chat template as its workers published them
(web/model_texts.py), so these answer without a worker, with the ids that model's worker
will see: a ``messages`` prompt is rendered as the worker renders it (the template's default
system prompt included, ``add_generation_prompt`` true by default). A model this cluster does
not know is a 404 ``model_not_found``; one known but whose tokenizer is not here yet, a 503.
"""
from __future__ import annotations

from typing import Any

from flask import jsonify
from flask_openapi3 import APIBlueprint, Tag
from pydantic import BaseModel, Field, model_validator

from web.chat_template import TemplateError
from web.errors import ApiError
from web.model_texts import TextModel
from web.text_model import text_model
from web.prompt_text import render
from web.openai.convert import stored_messages
from web.openai.schemas import ChatMessage, ToolDef
from web.routes_jobs import BODY_ERRORS, GUARD_ERRORS
from web.schemas import ErrorResponse, Strict, json_int

api = APIBlueprint("tokenize", __name__, abp_tags=[Tag(name="tokenizer", description="vLLM-compatible")])
MAX_TOKENS = 1_000_000
ERRORS = {**BODY_ERRORS, 404: ErrorResponse, 503: ErrorResponse, **GUARD_ERRORS}


class TokenizeRequest(Strict):
    """Either ``prompt`` (text as is) or ``messages`` (through the chat template)."""

    model: str | None = Field(default=None, max_length=200, description="whose tokenizer; default: the "
                              "model a request naming none gets")
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=256)
    add_generation_prompt: bool = Field(default=True, description="messages only: end with the assistant header")
    tools: list[ToolDef] | None = Field(default=None, max_length=128, description="messages only")
    add_special_tokens: bool | None = Field(default=None, description="default: true for prompt, false for "
                                            "messages (the template writes them)")
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("prompt: give exactly one of prompt and messages")
        if self.prompt is not None and self.tools is not None:
            raise ValueError("tools: only with messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(Strict):
    model: str | None = Field(default=None, max_length=200, description="whose tokenizer (as for /tokenize)")
    tokens: list[json_int(ge=0)] = Field(max_length=MAX_TOKENS)


class DetokenizeResponse(BaseModel):
    prompt: str


@api.post("/tokenize", summary="Token ids of a prompt or of chat messages (vLLM-compatible)",
          responses={200: TokenizeResponse, **ERRORS})
def tokenize(body: TokenizeRequest):
    model = text_model(body.model)
    text = body.prompt if body.prompt is not None else _render(model, body)
    special = body.add_special_tokens if body.add_special_tokens is not None else body.prompt is not None
    encoding = model.tokenizer.encode(text, add_special_tokens=special)  # lone surrogates: refused by web.guards
    return jsonify({"count": len(encoding.ids), "max_model_len": model.context_length,
                    "tokens": list(encoding.ids), "token_strs": list(encoding.tokens) if body.return_token_strs
                    else None})


@api.post("/detokenize", summary="The text of token ids (vLLM-compatible)",
          responses={200: DetokenizeResponse, **ERRORS})
def detokenize(body: DetokenizeRequest):
    tokenizer = text_model(body.model).tokenizer
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    bad = next((i for i, token in enumerate(body.tokens) if token >= vocab), None)
    if bad is not None:
        raise ApiError(422, "validation_error", f"tokens.{bad}: {body.tokens[bad]} is not a token id "
                       f"(the vocabulary has {vocab})", field=f"tokens.{bad}")
    return jsonify({"prompt": tokenizer.decode(body.tokens, skip_special_tokens=False)})


def _render(model: TextModel, body: TokenizeRequest) -> str:
    if model.template is None:
        raise ApiError(503, "tokenizer_unavailable", "the model's chat template is not prepared here yet",
                       retry_after=5)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    try:
        return render(model, stored_messages(body.messages or []), tools, body.add_generation_prompt)
    except TemplateError as exc:
        raise ApiError(422, "validation_error", f"messages: {exc}", field="messages") from None
