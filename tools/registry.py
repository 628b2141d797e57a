"""A registry of tools the agent may call: names, JSON Schema parameters and executors.

Arguments come from a small language model, so every call is validated with jsonschema
before the executor sees it: unknown tools, missing or undeclared arguments and wrong
types come back as a failed :class:`ToolResult` (the agent feeds the error back to the
model) instead of an exception deep inside a tool.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import jsonschema
from jsonschema import Draft202012Validator

# Why a call failed; lets the agent and the evaluation tell routing from tool errors.
UNKNOWN_TOOL = "unknown_tool"
INVALID_ARGUMENTS = "invalid_arguments"
TOOL_ERROR = "tool_error"


class ToolError(Exception):
    """Raised by an executor for an expected failure (bad input, budget exceeded)."""


class RegistryError(ValueError):
    """A tool definition cannot be registered (duplicate name, invalid schema)."""


class UnknownToolError(LookupError):
    """No tool with this name is registered."""


@dataclass(frozen=True)
class ToolResult:
    """What a tool call produced. ``content`` is the text handed back to the model."""

    success: bool
    content: str = ""
    error: str | None = None
    error_kind: str | None = None

    @classmethod
    def ok(cls, content: str) -> "ToolResult":
        return cls(success=True, content=content)

    @classmethod
    def fail(cls, error: str, kind: str = TOOL_ERROR) -> "ToolResult":
        return cls(success=False, content="", error=error, error_kind=kind)

    def to_dict(self) -> dict[str, Any]:
        return {"success": self.success, "content": self.content, "error": self.error,
                "error_kind": self.error_kind}


Executor = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Tool:
    """One callable tool; ``parameters`` is a JSON Schema object for its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]
    executor: Executor


class ToolRegistry:
    """Holds tools by name, validates arguments and runs executors."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, Draft202012Validator] = {}

    def register(self, tool: Tool) -> None:
        if not tool.name or not tool.name.replace("_", "").isalnum():
            raise RegistryError(f"invalid tool name {tool.name!r}")
        if tool.name in self._tools:
            raise RegistryError(f"tool {tool.name!r} is already registered")
        schema = _closed_schema(tool.parameters)
        try:
            Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise RegistryError(f"tool {tool.name!r} has an invalid schema: {exc.message}") from exc
        self._tools[tool.name] = Tool(tool.name, tool.description, schema, tool.executor)
        self._validators[tool.name] = Draft202012Validator(schema)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownToolError(f"unknown tool {name!r}; available: {', '.join(self._tools)}") from None

    def validation_error(self, name: str, arguments: object) -> str | None:
        """The first problem with ``arguments`` for tool ``name``, or None when they are valid."""
        if name not in self._tools:
            return f"unknown tool {name!r}; available: {', '.join(self._tools)}"
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        errors = sorted(self._validators[name].iter_errors(arguments), key=lambda e: list(e.path))
        if not errors:
            return None
        err = errors[0]
        where = "/".join(str(p) for p in err.path)
        return f"invalid arguments for {name}: {err.message}" + (f" (at {where})" if where else "")

    def execute(self, name: str, arguments: object) -> ToolResult:
        """Validate then run; expected failures come back as ``success=False``."""
        if name not in self._tools:
            return ToolResult.fail(f"unknown tool {name!r}; available: {', '.join(self._tools)}",
                                   UNKNOWN_TOOL)
        problem = self.validation_error(name, arguments)
        if problem:
            return ToolResult.fail(problem, INVALID_ARGUMENTS)
        try:
            return ToolResult.ok(self._tools[name].executor(dict(arguments)))  # type: ignore[arg-type]
        except ToolError as exc:
            return ToolResult.fail(str(exc), TOOL_ERROR)

    def openai_schemas(self) -> list[dict[str, Any]]:
        """OpenAI-compatible function-tool schemas (also what Qwen2.5's chat template renders)."""
        return [{"type": "function",
                 "function": {"name": t.name, "description": t.description,
                              "parameters": copy.deepcopy(t.parameters)}}
                for t in self._tools.values()]


def _closed_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    """Object schemas reject undeclared arguments unless the tool says otherwise."""
    schema = copy.deepcopy(parameters)
    if schema.get("type") == "object":
        schema.setdefault("additionalProperties", False)
        schema.setdefault("properties", {})
    return schema
