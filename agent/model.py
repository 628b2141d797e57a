"""The one thing the agent needs from a language model, plus the adapter over the engine.

``ChatModel.chat`` takes OpenAI-style messages and function-tool schemas and returns the
raw assistant text; unit tests pass a scripted fake, the worker passes
:class:`EngineChatModel` wrapping the loaded engine (greedy, so runs are reproducible).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from core.tool_calls import parse_tool_calls
from core import grammar
from core.grammar import Constraint, ToolSpec
from engine.types import GenerationRequest, GenerationResult, SamplingParams, TextGenerator


class ChatModel(Protocol):
    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
             max_new_tokens: int) -> str: ...


class GenerationCancelled(Exception):
    """The caller's ``should_cancel`` stopped a generation (job cancelled or timed out)."""


class EngineChatModel:
    """Greedy chat over any :class:`engine.types.TextGenerator`.

    When tools are offered it stops generating as soon as a complete tool call has been
    written and something else starts: the 0.5B model otherwise goes on to invent the
    tool's response (``{"response": "963"}``) and call again, costing seconds per step.

    ``constrained`` (default): tool-call turns carry the same lazy grammar as
    ``tool_choice: auto`` on ``/v1`` (:func:`core.grammar.tool_calls`): the model may answer
    in text, but once it writes a call (a ``<tool_call>`` tag, or JSON whose first key is
    ``"name"`` naming a declared tool, bare or fenced: :func:`core.grammar.call_trigger`)
    the rest is held to ONE valid call of a declared tool (exact name, arguments that
    validate), ended right after it; the loop takes further calls in later steps. JSON
    that answers (``{"result": 963}``) stays text.
    """

    def __init__(self, generator: TextGenerator, method: str = "official",
                 should_cancel: Callable[[], bool] | None = None, early_stop: bool = True,
                 constrained: bool = True, priority: int = 1):
        self.generator = generator
        self.priority = priority  # the engine's class rank for every call (core/priorities.py)
        self.constrained = constrained
        self.method = method
        self.should_cancel = should_cancel
        self.early_stop = early_stop
        self.last_result: GenerationResult | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
             max_new_tokens: int) -> str:
        request = GenerationRequest(messages=messages, tools=tools or None, method=self.method,
                                    sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
                                    constraint=tool_grammar(tools) if tools and self.constrained else None,
                                    priority=self.priority)
        watcher = _CallWatcher(bool(tools) and self.early_stop)
        outer_cancel = self.should_cancel

        def should_cancel() -> bool:
            return bool(outer_cancel and outer_cancel()) or watcher.complete

        result = self.generator.generate(request, on_text=watcher.feed, should_cancel=should_cancel)
        if outer_cancel and outer_cancel():
            raise GenerationCancelled("generation stopped by the caller")
        self.last_result = result
        self.prompt_tokens += result.usage.prompt_tokens
        self.completion_tokens += result.usage.completion_tokens
        return result.text


def tool_grammar(tools: list[dict[str, Any]]) -> Constraint:
    """The lazy one-call grammar over OpenAI-style function tools."""
    specs = [ToolSpec(t["function"]["name"], t["function"].get("parameters") or dict(grammar.EMPTY_OBJECT))
             for t in tools]
    return grammar.tool_calls(specs, parallel=False, lazy=True)


class _CallWatcher:
    """Accumulates streamed text; ``complete`` once a tool call is followed by other text."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.text = ""
        self.complete = False

    def feed(self, chunk: str) -> None:
        if not self.enabled or self.complete:
            return
        self.text += chunk
        if not chunk.strip():
            return
        parsed = parse_tool_calls(self.text)
        if parsed.calls and not parsed.malformed:
            rest = parsed.content.strip()
            # Done when other text follows the call(s); another call may still begin.
            self.complete = bool(rest) and not _may_start_call(rest)


_CALL_OPENINGS = ('{"name"', "<tool_call>", "```")


def _may_start_call(rest: str) -> bool:
    return any(rest.startswith(o) or o.startswith(rest) for o in _CALL_OPENINGS)
