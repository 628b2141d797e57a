"""Render a request into prompt token ids exactly as every method sees them.

The chat template runs with ``add_generation_prompt=True``; ``request.prefix`` becomes the
system message and ``request.tools`` goes through the template's tools section. The
*prefix part* (what ``prefix_cache`` keys on) is the rendered system block (the given
prefix, or the template's default system text, plus any tools), whose token ids are a
prefix of the full prompt's ids because the block ends right before an ``<|im_start|>``
special token.

A text completion (``request.raw_prompt``) skips the template: its text is encoded as is,
with the tokenizer's own special tokens (a BOS where the tokenizer adds one, as vLLM's
``/v1/completions`` does); its prefix part is empty.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.prompt_block import system_block, tokens_before
from engine.types import GenerationRequest


class PromptError(ValueError):
    """The request cannot be rendered (e.g. a system part given twice)."""


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    prefix_len: int  # ids[:prefix_len] is the rendered system block

    @property
    def prefix_ids(self) -> list[int]:
        return self.ids[:self.prefix_len]


def chat_messages(request: GenerationRequest) -> list[dict[str, Any]]:
    messages = [dict(m) for m in request.messages]
    if request.prefix is not None:
        if messages and messages[0].get("role") == "system":
            raise PromptError("give the system part either as prefix or as a system message, not both")
        messages.insert(0, {"role": "system", "content": request.prefix})
    if not messages:
        raise PromptError("a request needs at least one message")
    return messages


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def raw_prompt(tokenizer: Any, text: str) -> Prompt:
    """A completion prompt's ids: the text as is (special tokens written in it are parsed)."""
    ids = list(tokenizer.encode(text, add_special_tokens=True))
    if not ids:
        raise PromptError("a completion prompt needs at least one token")
    return Prompt(ids=ids, prefix_len=0)


def build_prompt(tokenizer: Any, request: GenerationRequest) -> Prompt:
    """Token ids of the full prompt, and how many of them form the cacheable system block:
    one render and one encoding in the usual case (:mod:`core.prompt_block`)."""
    if request.raw_prompt is not None:
        return raw_prompt(tokenizer, request.raw_prompt)
    messages = chat_messages(request)
    full_text = _render(tokenizer, messages, request.tools, generation_prompt=True)
    prefix_text = system_block(messages, full_text,
                               lambda probe: _render(tokenizer, probe, request.tools, generation_prompt=False))
    if not getattr(tokenizer, "is_fast", False):  # no offsets: encode the block on its own
        return _slow_prompt(tokenizer, full_text, prefix_text)
    encoding = tokenizer(full_text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoding["input_ids"])
    return Prompt(ids=ids, prefix_len=tokens_before(encoding["offset_mapping"], len(prefix_text)))


def _slow_prompt(tokenizer: Any, full_text: str, prefix_text: str) -> Prompt:
    ids = _encode(tokenizer, full_text)
    prefix_len = 0
    if prefix_text:
        prefix_ids = _encode(tokenizer, prefix_text)
        if ids[:len(prefix_ids)] == prefix_ids:
            prefix_len = len(prefix_ids)
    return Prompt(ids=ids, prefix_len=prefix_len)
