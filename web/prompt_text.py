"""One request's prompt as the web counts it: rendered once with its model's chat template,
encoded once; the same encoding gives the prompt-length check its count and the prefix
router the system block's token ids.

The render follows engine/prompt.py (``prefix`` as the system message, ``tools`` through
the template, the assistant header last) and finds the system block by the same rule
(:mod:`core.prompt_block`). It is the web's jinja rendering of the
worker's template, not transformers' own code, so the count is for checking and routing
only: the worker renders and encodes the prompt it runs itself (0.2 ms a job), and no id
computed here ever reaches the model. Without a template (or when it refuses the messages)
the count is an upper-bound estimate: each text's tokens plus a margin per message and for
the template's own text.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.prompt_block import system_block, tokens_before
from web.model_texts import TextModel

PER_MESSAGE_TOKENS = 8
TEMPLATE_TOKENS = 48


@dataclass(frozen=True)
class PromptCount:
    tokens: int
    exact: bool  # rendered with the model's template (else the estimate)
    system_ids: list[int] | None = None  # the rendered system block's ids, when rendered


def chat_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    messages = [dict(m) for m in request.get("messages") or []]
    prefix = request.get("prefix")
    if prefix is not None and not (messages and messages[0].get("role") == "system"):
        messages.insert(0, {"role": "system", "content": prefix})
    return messages


def count(model: TextModel, request: dict[str, Any]) -> PromptCount:
    """The request's prompt tokens with ``model``'s tokenizer (see the module doc); a
    ``raw_prompt`` (a text completion's) is encoded as is, as engine/prompt.py does."""
    if request.get("raw_prompt") is not None:
        return PromptCount(len(model.tokenizer.encode(request["raw_prompt"], add_special_tokens=True).ids), exact=True)
    if model.template is not None:
        try:
            return _rendered(model, chat_messages(request), request.get("tools"))
        except Exception:  # noqa: BLE001 - a template this web cannot render: estimate (the worker decides)
            pass
    return estimate(model, request)


def estimate(model: TextModel, request: dict[str, Any]) -> PromptCount:
    texts = [str(m.get("content") or "") for m in request.get("messages") or []]
    if request.get("prefix"):
        texts.append(request["prefix"])
    encodings = model.tokenizer.encode_batch(texts, add_special_tokens=False)
    tokens = sum(len(e.ids) for e in encodings) + PER_MESSAGE_TOKENS * len(texts) + TEMPLATE_TOKENS
    return PromptCount(tokens, exact=False)


def render(model: TextModel, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool) -> str:
    return model.template.render(**{**model.special_tokens, "messages": messages, "tools": tools or None,
                                    "add_generation_prompt": generation_prompt})


def _rendered(model: TextModel, messages: list[dict[str, Any]], tools: Any) -> PromptCount:
    text = render(model, messages, tools, generation_prompt=True)
    encoding = model.tokenizer.encode(text, add_special_tokens=False)
    has_system = bool(messages) and messages[0].get("role") == "system"
    # no system part of the request's own: no routing key (the template's default is shared by all)
    block = system_block(messages, text, lambda probe: render(model, probe, tools, generation_prompt=False)) \
        if has_system else ""
    before = tokens_before(encoding.offsets, len(block))
    return PromptCount(len(encoding.ids), exact=True, system_ids=list(encoding.ids[:before]) if before else None)
