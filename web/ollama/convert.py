"""An Ollama request as the OpenAI routes' request, so the same job is built and submitted.

``/api/chat`` becomes a ``ChatCompletionRequest`` (``web.openai.convert.chat_job`` then builds
the ``chat`` job: chat template, tools, grammar); ``/api/generate`` becomes one too (the
prompt as a user turn, ``system`` before it), or with ``raw`` or ``suffix`` a
``CompletionRequest`` (the prompt as is; fill-in-the-middle). Options map to OpenAI fields
(:data:`web.ollama.schemas.OPTIONS`); ``format`` is ``response_format``. The OpenAI models
check the ranges, and any error they, the job builder or the submission raise names the
Ollama field (:func:`ollama_fields`).
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Iterator

from pydantic import ValidationError

from web.context import ctx
from web.errors import ApiError, validation_details
from web.ollama.schemas import OPTIONS, ChatRequest, GenerateRequest, GenerationBase, OllamaMessage
from web.openai.completion_schemas import CompletionRequest
from web.openai.schemas import ChatCompletionRequest

FORMAT_NAME = "format"  # json_schema's name for an Ollama format schema
RENAMES = {openai: f"options.{name}" for name, openai in OPTIONS.items()} | {
    "response_format.json_schema.schema": "format", "response_format": "format",
    "max_new_tokens": "options.num_predict"}  # the context check's name for the token budget


def _renamed(field_name: str | None, extra: dict[str, str] | None = None) -> str | None:
    """The Ollama spelling of an OpenAI field path (``max_tokens`` -> ``options.num_predict``)."""
    if not field_name:
        return field_name
    for old, new in sorted({**RENAMES, **(extra or {})}.items(), key=lambda item: -len(item[0])):
        if field_name == old or field_name.startswith(old + "."):
            return new + field_name[len(old):]
    return field_name


def _refuse(field_name: str, why: str) -> ApiError:
    return ApiError(400, "validation_error", f"{field_name}: {why}", field=field_name)


@contextmanager
def ollama_fields(extra: dict[str, str] | None = None) -> Iterator[None]:
    """Errors raised while translating and submitting name the Ollama field, not the OpenAI
    one (``extra``: a route's own renames)."""
    try:
        yield
    except ValidationError as exc:
        first = (validation_details(exc) or [{"field": "body", "message": "invalid"}])[0]
        name = _renamed(first["field"], extra)
        raise _refuse(name or "body", first["message"]) from None
    except ApiError as exc:
        name = _renamed(exc.field, extra)
        if name != exc.field and exc.field and exc.message.startswith(exc.field + ":"):
            exc.message = name + exc.message[len(exc.field):]
        exc.field = name
        raise


def _common(body: GenerationBase) -> dict[str, Any]:
    """The OpenAI fields of what chat and generate share: model, stream, options."""
    if body.think:
        raise _refuse("think", "not supported: the models here do not think in a separate channel; only false")
    if body.logprobs:
        raise _refuse("logprobs", "not supported on /api; use /v1/chat/completions")
    if body.top_logprobs is not None:
        raise _refuse("top_logprobs", "not supported on /api; use /v1/chat/completions")
    out: dict[str, Any] = {"model": body.model, "stream": body.stream}
    options = body.options.model_dump(exclude_none=True, exclude={"num_ctx"}) if body.options else {}
    for name, value in options.items():
        out[OPTIONS[name]] = value
    if out.get("max_tokens") == -1:  # Ollama's "until a stop": as long as the server allows
        out["max_tokens"] = ctx().settings.max_new_tokens_cap
    return out


def _response_format(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": FORMAT_NAME, "schema": fmt}}


def _message(message: OllamaMessage, index: int) -> dict[str, Any]:
    """One Ollama message as an OpenAI chat message (arguments as JSON text, as OpenAI sends them)."""
    if message.images:
        raise _refuse(f"messages.{index}.images", "not supported: the models here read text only")
    if message.thinking:
        raise _refuse(f"messages.{index}.thinking", "not supported: the models here do not think apart")
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": f"call_{index}_{n}", "type": "function",
                              "function": {"name": call.function.name,
                                           "arguments": json.dumps(call.function.arguments, ensure_ascii=False)}}
                             for n, call in enumerate(message.tool_calls)]
    if message.tool_name is not None:
        if message.role != "tool":
            raise _refuse(f"messages.{index}.tool_name", "only on a tool message")
        out["name"] = message.tool_name
    return out


def chat_request(body: ChatRequest) -> ChatCompletionRequest:
    """``/api/chat`` as ``/v1/chat/completions`` would receive it."""
    openai: dict[str, Any] = {**_common(body), "messages": [_message(m, i) for i, m in enumerate(body.messages)]}
    if body.tools:
        openai["tools"] = body.tools
    if (response_format := _response_format(body.format)) is not None:
        openai["response_format"] = response_format
    return ChatCompletionRequest.model_validate(openai)


def uses_completion(body: GenerateRequest) -> bool:
    """``raw`` or ``suffix``: the prompt runs as is (no chat template), as a completion job."""
    return bool(body.raw) or body.suffix is not None


def _generate_refusals(body: GenerateRequest) -> None:
    if body.template:
        raise _refuse("template", "not supported: the model's own chat template is used (or send raw: true "
                      "with the prompt already templated)")
    if body.context:
        raise _refuse("context", "not supported: send the conversation as messages to /api/chat")
    if body.images:
        raise _refuse("images", "not supported: the models here read text only")
    if uses_completion(body):
        if body.system is not None:
            raise _refuse("system", "not with raw or suffix (the prompt is used as is)")
        if body.format not in (None, ""):
            raise _refuse("format", "not with raw or suffix; use it with a templated prompt")


def generate_chat_request(body: GenerateRequest) -> ChatCompletionRequest:
    """``/api/generate`` without ``raw``: ``system`` and ``prompt`` as chat turns."""
    _generate_refusals(body)
    messages = ([{"role": "system", "content": body.system}] if body.system is not None else [])
    openai: dict[str, Any] = {**_common(body), "messages": [*messages, {"role": "user", "content": body.prompt}]}
    if (response_format := _response_format(body.format)) is not None:
        openai["response_format"] = response_format
    return ChatCompletionRequest.model_validate(openai)


def generate_completion_request(body: GenerateRequest) -> CompletionRequest:
    """``/api/generate`` with ``raw`` or ``suffix``: the prompt as is; a suffix makes it a
    fill-in-the-middle prompt (a 400 naming ``suffix`` when the model has no FIM tokens)."""
    _generate_refusals(body)
    openai: dict[str, Any] = {**_common(body), "prompt": body.prompt}
    openai.setdefault("max_tokens", ctx().settings.default_max_new_tokens)  # not /v1/completions' 16
    if body.suffix is not None:
        openai["suffix"] = body.suffix
    return CompletionRequest.model_validate(openai)
