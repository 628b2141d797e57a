"""The one thing the agent needs from a language model, plus the adapter over the engine.

``ChatModel.chat`` takes OpenAI-style messages and function-tool schemas and returns the
raw assistant text; unit tests pass a scripted fake, the worker passes
:class:`EngineChatModel` wrapping the loaded engine (greedy, so runs are reproducible).
"""
from __future__ import annotations

from typing import Any, Protocol

from engine.types import GenerationRequest, GenerationResult, SamplingParams, TextGenerator


class ChatModel(Protocol):
    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
             max_new_tokens: int) -> str: ...


class EngineChatModel:
    """Greedy chat over any :class:`engine.types.TextGenerator`; keeps the last result's usage."""

    def __init__(self, generator: TextGenerator, method: str = "official", should_cancel=None):
        self.generator = generator
        self.method = method
        self.should_cancel = should_cancel
        self.last_result: GenerationResult | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
             max_new_tokens: int) -> str:
        request = GenerationRequest(messages=messages, tools=tools or None, method=self.method,
                                    sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
        result = self.generator.generate(request, should_cancel=self.should_cancel)
        self.last_result = result
        self.prompt_tokens += result.usage.prompt_tokens
        self.completion_tokens += result.usage.completion_tokens
        return result.text
