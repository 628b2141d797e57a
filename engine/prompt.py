"""Render a request into prompt token ids exactly as every method sees them.

The chat template runs with ``add_generation_prompt=True``; ``request.prefix`` becomes the
system message and ``request.tools`` goes through the template's tools section. The
*prefix part* (what ``prefix_cache`` keys on) is the rendered system block (the given
prefix, or the template's default system text, plus any tools), whose token ids are a
prefix of the full prompt's ids because the block ends right before an ``<|im_start|>``
special token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


MARKER = "<|im_start|>user"  # where the system block ends (the chat templates MiniServe renders)


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def build_prompt(tokenizer: Any, request: GenerationRequest) -> Prompt:
    """Token ids of the full prompt, and how many of them form the cacheable system block.

    One render and one encoding in the usual case: the system block is the full text up to
    its first user header when the first message after the system part is the user's (the
    block does not depend on what follows it); otherwise a probe (system part plus a user
    "x") is rendered to find it. Its token count comes from the same encoding's offsets: the
    block ends where a token starts (the ``<|im_start|>`` special token)."""
    messages = chat_messages(request)
    full_text = _render(tokenizer, messages, request.tools, generation_prompt=True)
    prefix_text = _system_block(tokenizer, messages, request.tools, full_text)
    if not getattr(tokenizer, "is_fast", False):  # no offsets: encode the block on its own
        return _slow_prompt(tokenizer, full_text, prefix_text)
    encoding = tokenizer(full_text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoding["input_ids"])
    return Prompt(ids=ids, prefix_len=_tokens_before(encoding["offset_mapping"], len(prefix_text)))


def _system_block(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, full_text: str) -> str:
    """The rendered system block (the given system part or the template's default, tools
    included): a prefix of ``full_text``, or "" when the template shows none."""
    system = [m for m in messages[:1] if m.get("role") == "system"]
    following = messages[len(system):len(system) + 1]
    if following and following[0].get("role") == "user":
        text = full_text
    else:
        text = _render(tokenizer, system + [{"role": "user", "content": "x"}], tools, generation_prompt=False)
    cut = text.find(MARKER)
    prefix_text = text[:cut] if cut > 0 else ""
    return prefix_text if prefix_text and full_text.startswith(prefix_text) else ""


def _tokens_before(offsets: list[tuple[int, int]], cut: int) -> int:
    """How many tokens cover ``text[:cut]``: the index of the token that starts at ``cut``
    (0 when none does: no token boundary there, so no cacheable block)."""
    if cut <= 0:
        return 0
    for index, (start, _end) in enumerate(offsets):
        if start >= cut:
            return index if start == cut else 0
    return 0


def _slow_prompt(tokenizer: Any, full_text: str, prefix_text: str) -> Prompt:
    ids = _encode(tokenizer, full_text)
    prefix_len = 0
    if prefix_text:
        prefix_ids = _encode(tokenizer, prefix_text)
        if ids[:len(prefix_ids)] == prefix_ids:
            prefix_len = len(prefix_ids)
    return Prompt(ids=ids, prefix_len=prefix_len)
