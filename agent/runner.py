"""The agent loop: model -> tool calls -> safeguards -> registry -> tool results -> model.

Outcomes are distinct so the API can map them: ``completed`` (an answer, possibly after
a repeated call cut the loop short), ``malformed_tool_call`` and ``max_steps_exceeded``
(both answered with HTTP 422 and the trace).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from agent.answering import answer_messages, fallback_answer, no_notes_answer
from agent.model import ChatModel
from core.tool_calls import ParsedOutput, ToolCall, parse_tool_calls
from agent.prompts import ANSWER_PROMPT, SYSTEM_PROMPT
from agent.safeguards import (CALCULATOR, REROUTE, REROUTE_RETRIEVAL, RETRIEVE, Decision, PromptFacts,
                              analyze_prompt, forced_call, forced_retrieval, guard_call, guard_query)
from core.logs import log_event
from tools import INVALID_ARGUMENTS, ToolRegistry, ToolResult
from tools.retriever import parse_notes

logger = logging.getLogger("miniserve.agent")

COMPLETED, MALFORMED, MAX_STEPS = "completed", "malformed_tool_call", "max_steps_exceeded"
# Why a completed run stopped.
ANSWER, REPEATED, NO_NOTES = "answer", "repeated_call", "no_notes"


@dataclass
class AgentStep:
    """One tool execution (or one unreadable tool call) as recorded in the trace."""

    step: int
    raw_output: str
    model_tool_name: str | None
    tool_name: str | None
    model_arguments: dict[str, Any] | None
    arguments: dict[str, Any] | None
    safeguard_applied: bool = False
    safeguards: list[str] = field(default_factory=list)
    result: str = ""
    success: bool = False
    error: str | None = None
    error_kind: str | None = None
    parse_format: str | None = None
    latency_ms: float = 0.0
    model_latency_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AgentResult:
    text: str
    steps: int
    trace: list[AgentStep]
    status: str
    finish_reason: str
    error: str | None = None
    model_calls: int = 0
    outputs: list[str] = field(default_factory=list)  # every raw model output, in order
    latency_ms: float = 0.0
    messages: list[dict[str, Any]] = field(default_factory=list)  # history in Qwen2.5's tool format

    @property
    def ok(self) -> bool:
        return self.status == COMPLETED

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "steps": self.steps, "trace": [s.to_dict() for s in self.trace],
                "status": self.status, "finish_reason": self.finish_reason, "error": self.error,
                "model_calls": self.model_calls, "outputs": self.outputs,
                "latency_ms": round(self.latency_ms, 1)}


StepCallback = Callable[[dict[str, Any]], None]
TextCallback = Callable[[str], None]


@dataclass
class _Run:
    """Mutable state of one run."""

    prompt: str
    facts: PromptFacts
    messages: list[dict[str, Any]]
    trace: list[AgentStep] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    repeated: bool = False


class AgentRunner:
    def __init__(self, model: ChatModel, registry: ToolRegistry, system_prompt: str = SYSTEM_PROMPT,
                 max_steps: int = 3, max_new_tokens: int = 128, safeguards: bool = True,
                 answer_prompt: str = ANSWER_PROMPT):
        self.model = model
        self.registry = registry
        self.system_prompt = system_prompt
        self.answer_prompt = answer_prompt
        self.max_steps = max_steps
        self.max_new_tokens = max_new_tokens
        self.safeguards = safeguards

    def run(self, prompt: str, max_steps: int | None = None, max_new_tokens: int | None = None,
            on_step: StepCallback | None = None, on_text: TextCallback | None = None) -> AgentResult:
        """Answer ``prompt``, calling at most ``max_steps`` tools."""
        start = time.perf_counter()
        limit = self.max_steps if max_steps is None else max_steps
        tokens = max_new_tokens or self.max_new_tokens
        run = _Run(prompt, analyze_prompt(prompt), [{"role": "system", "content": self.system_prompt},
                                            {"role": "user", "content": prompt}])
        result = self._loop(run, limit, tokens, on_step)
        result.latency_ms = (time.perf_counter() - start) * 1000
        if result.ok and on_text:
            on_text(result.text)
        log_event(logger, "agent_finished", status=result.status, finish_reason=result.finish_reason,
                  steps=result.steps, model_calls=result.model_calls, latency_ms=round(result.latency_ms, 1))
        return result

    def _loop(self, run: _Run, limit: int, tokens: int, on_step: StepCallback | None) -> AgentResult:
        """Tools are offered until a step ends in something to answer from; then the model is
        asked to answer with tools withheld (the 0.5B model otherwise keeps calling them)."""
        tools = self.registry.openai_schemas()
        answering = False
        while True:
            raw, model_ms = self._chat(run, None if answering else tools, tokens)
            parsed = parse_tool_calls(raw, self.registry.names)
            if parsed.malformed:
                step = AgentStep(len(run.trace) + 1, raw, None, None, None, None, error=parsed.error,
                                 error_kind=MALFORMED, parse_format=parsed.format, model_latency_ms=model_ms)
                run.trace.append(step)
                _notify(on_step, step)
                return self._result(run, raw, MALFORMED, MALFORMED, parsed.error)
            decisions = self._decide(run, parsed)
            if not decisions:
                return self._result(run, parsed.content, COMPLETED, ANSWER)
            fresh = _fresh(decisions, run.seen)
            if not fresh:
                run.repeated = True
                if answering:
                    return self._result(run, fallback_answer(run.prompt, run.trace), COMPLETED, REPEATED)
                answering = True
                continue
            budget = limit - len(run.trace)
            if budget <= 0:
                return self._result(run, parsed.content, MAX_STEPS, MAX_STEPS,
                                    f"the model asked for more than {limit} tool calls")
            outcomes = self._execute(run, raw, parsed, fresh[:budget], model_ms, on_step)
            answering = len(fresh) > budget or self._should_answer(run, outcomes)
            if answering and _nothing_found(run.trace):
                return self._result(run, no_notes_answer(run.prompt), COMPLETED, NO_NOTES)

    def _chat(self, run: _Run, tools: list[dict[str, Any]] | None, tokens: int) -> tuple[str, float]:
        t0 = time.perf_counter()
        messages = run.messages if tools else \
            answer_messages(self.answer_prompt, run.prompt, run.trace)
        raw = self.model.chat(messages, tools, tokens)
        run.outputs.append(raw)
        return raw, (time.perf_counter() - t0) * 1000

    def _should_answer(self, run: _Run, outcomes: list[ToolResult]) -> bool:
        """Answer next, unless the model can still fix its arguments, or the prompt holds
        several expressions and fewer have been computed (then it may call again)."""
        if any(o.error_kind == INVALID_ARGUMENTS for o in outcomes):
            return False
        computed = sum(1 for s in run.trace if s.tool_name == CALCULATOR and s.success)
        return not (self.safeguards and 1 < len(run.facts.expressions) > computed)

    def _decide(self, run: _Run, parsed: ParsedOutput) -> list[Decision]:
        if not self.safeguards:
            return [Decision(c, c) for c in parsed.calls]
        if not parsed.calls:
            forced = None if run.trace else self._forced(run)
            return [forced] if forced else []
        return [self._guard(run, c) for c in parsed.calls]

    def _forced(self, run: _Run) -> Decision | None:
        return forced_call(run.facts) or forced_retrieval(run.facts, run.prompt, self._notes_match(run))

    def _guard(self, run: _Run, call: ToolCall) -> Decision:
        decision = guard_call(call, run.facts)
        if decision.call.name not in self.registry:  # an invented tool: route as if no call was made
            forced = self._forced(run)
            if forced:
                return Decision(forced.call, call, [REROUTE if forced.call.name == CALCULATOR else REROUTE_RETRIEVAL])
        if decision.call.name == RETRIEVE:
            return guard_query(decision, run.prompt)
        return decision

    def _notes_match(self, run: _Run) -> bool:
        if not run.facts.knowledge_question or RETRIEVE not in self.registry:
            return False
        probe = self.registry.execute(RETRIEVE, {"query": run.prompt})
        return probe.success and bool(parse_notes(probe.content))

    def _execute(self, run: _Run, raw: str, parsed: ParsedOutput, decisions: list[Decision],
                 model_ms: float, on_step: StepCallback | None) -> list[ToolResult]:
        """Run each call, then append one assistant message and one tool message per call."""
        calls, results = [], []
        for i, decision in enumerate(decisions):
            t0 = time.perf_counter()
            outcome = self.registry.execute(decision.call.name, decision.call.arguments)
            step = _make_step(len(run.trace) + 1, raw, decision, outcome, parsed.format,
                              (time.perf_counter() - t0) * 1000, model_ms if i == 0 else 0.0)
            run.trace.append(step)
            run.seen.add(_key(decision.call))
            calls.append(decision.call)
            results.append(outcome)
            # The model's tool name is model-written text: log it only when it names a real tool.
            model_tool = step.model_tool_name if step.model_tool_name in self.registry else "<unknown>"
            log_event(logger, "tool_executed", step=step.step, model_tool_name=model_tool,
                      tool_name=step.tool_name, safeguard_applied=step.safeguard_applied,
                      success=step.success, latency_ms=round(step.latency_ms, 2))
            _notify(on_step, step)
        run.messages.append(_assistant_message(parsed.content, calls, len(run.trace) - len(calls)))
        for j, (call, outcome) in enumerate(zip(calls, results)):
            run.messages.append({"role": "tool", "tool_call_id": f"call_{len(run.trace) - len(calls) + j + 1}",
                                 "name": call.name, "content": _tool_content(outcome)})
        return results

    def _result(self, run: _Run, text: str, status: str, reason: str, error: str | None = None) -> AgentResult:
        executed = sum(1 for s in run.trace if s.tool_name)
        if reason == ANSWER and run.repeated:
            reason = REPEATED
        return AgentResult(text=text, steps=executed, trace=run.trace, status=status, finish_reason=reason,
                           error=error, model_calls=len(run.outputs), outputs=run.outputs,
                           messages=run.messages)


def _make_step(index: int, raw: str, decision: Decision, outcome: ToolResult,
               fmt: str | None, tool_ms: float, model_ms: float) -> AgentStep:
    original = decision.original
    return AgentStep(
        step=index, raw_output=raw,
        model_tool_name=original.name if original else None,
        tool_name=decision.call.name,
        model_arguments=original.arguments if original else None,
        arguments=decision.call.arguments,
        safeguard_applied=bool(decision.applied), safeguards=list(decision.applied),
        result=outcome.content, success=outcome.success, error=outcome.error,
        error_kind=outcome.error_kind, parse_format=fmt, latency_ms=tool_ms, model_latency_ms=model_ms)


def _assistant_message(content: str, calls: list[ToolCall], first_index: int) -> dict[str, Any]:
    """In the shape Qwen2.5's chat template renders: arguments as an object, not a string."""
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": f"call_{first_index + i + 1}", "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments}}
                           for i, c in enumerate(calls)]}


def _tool_content(outcome: ToolResult) -> str:
    return outcome.content if outcome.success else f"Error: {outcome.error}"


def _fresh(decisions: list[Decision], seen: set[str]) -> list[Decision]:
    """Calls not run before, each once (the model may write the same call many times)."""
    out, keys = [], set(seen)
    for decision in decisions:
        if _key(decision.call) not in keys:
            keys.add(_key(decision.call))
            out.append(decision)
    return out


def _nothing_found(trace: list[AgentStep]) -> bool:
    """Every tool that ran was a note search that found nothing: there is nothing to answer
    from, and the 0.5B model, asked anyway, answers "0"."""
    ran = [s for s in trace if s.tool_name]
    return bool(ran) and all(s.tool_name == RETRIEVE and s.success and not parse_notes(s.result) for s in ran)


def _key(call: ToolCall) -> str:
    return call.name + json.dumps(call.arguments, sort_keys=True, ensure_ascii=False)


def _notify(callback: StepCallback | None, step: AgentStep) -> None:
    if callback:
        callback(step.to_dict())
