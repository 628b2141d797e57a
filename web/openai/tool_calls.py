"""Tool calls for ``/v1/chat/completions``: check the request's function schemas, then
recognise calls in the model's final text and validate them.

Recognition is the agent's parser (:mod:`core.tool_calls`: ``<tool_call>`` tags, bare JSON,
```json fences, several calls, truncated output). A call is returned only when it names a
function the request declared (and the one ``tool_choice`` names, if any) and its
arguments validate against that function's ``parameters`` schema; if any recognised call
fails, the whole answer is plain content, so a client never gets a half-valid set.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.validators import validator_for

from core.tool_calls import ToolCall, parse_tool_calls
from web.openai.call_stream import call_id
from web.errors import ApiError

EMPTY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolSet:
    """The request's functions with their compiled argument validators."""

    validators: dict[str, Any]
    only: str | None = None  # tool_choice names this function
    parallel: bool = True  # parallel_tool_calls

    @property
    def names(self) -> list[str]:
        return list(self.validators)


@dataclass
class Recognised:
    """What the final text holds: valid ``calls`` (may be empty) and the ``content``."""

    calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None
    rejected: list[str] = field(default_factory=list)  # why recognised calls were refused


def compile_tools(tools: list[dict[str, Any]], only: str | None = None, parallel: bool = True) -> ToolSet:
    """Validators for each declared function; a 400 naming the bad schema or duplicate."""
    validators: dict[str, Any] = {}
    for i, tool in enumerate(tools):
        function = tool["function"]
        name = function["name"]
        if name in validators:
            raise ApiError(422, "validation_error", f"tools: function {name!r} is declared twice",
                           field=f"tools.{i}.function.name")
        schema = function.get("parameters") or EMPTY_OBJECT_SCHEMA
        cls = validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ApiError(422, "validation_error", f"tools: parameters of {name!r} is not a valid JSON Schema: "
                           f"{exc.message}", field=f"tools.{i}.function.parameters") from None
        validators[name] = cls(schema)
    if only is not None and only not in validators:
        raise ApiError(422, "validation_error", f"tool_choice: function {only!r} is not among the request's tools",
                       field="tool_choice")
    return ToolSet(validators, only, parallel)


def argument_problem(tools: ToolSet, call: ToolCall) -> str | None:
    """Why ``call`` may not be returned, or None when it is a valid call."""
    if call.name not in tools.validators:
        return f"{call.name!r} is not a declared function"
    if tools.only is not None and call.name != tools.only:
        return f"{call.name!r} is not the function tool_choice names"
    try:
        error = jsonschema.exceptions.best_match(tools.validators[call.name].iter_errors(call.arguments))
    except Exception as exc:  # noqa: BLE001 - a client's schema may fail to apply (unresolvable $ref, ...)
        return f"arguments of {call.name!r} cannot be checked: {type(exc).__name__}"
    return None if error is None else f"arguments of {call.name!r}: {error.message}"


def recognise(text: str, tools: ToolSet) -> Recognised:
    """Tool calls in ``text`` (all valid) or plain content."""
    parsed = parse_tool_calls(text, known_tools=tools.names)
    if not parsed.calls:
        return Recognised(content=text)
    problems = [p for p in (argument_problem(tools, call) for call in parsed.calls) if p]
    if problems:
        return Recognised(content=text, rejected=problems)
    calls = parsed.calls if tools.parallel else parsed.calls[:1]
    return Recognised(calls=calls, content=parsed.content or None)


def openai_tool_calls(calls: list[ToolCall], job_id: str) -> list[dict[str, Any]]:
    """The calls in OpenAI's shape (``arguments`` as JSON text), with ids unique per job."""
    return [{"id": call_id(job_id, i), "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
            for i, call in enumerate(calls)]
