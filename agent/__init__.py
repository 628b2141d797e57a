"""The tool-calling agent: a bounded loop over a chat model protocol and the tool registry.

Names are imported on first access (PEP 562), so ``import agent.parsing`` (pure stdlib,
used by the web to recognise tool calls) does not pull in the engine's types.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ChatModel": "agent.model", "EngineChatModel": "agent.model",
    "ParsedOutput": "agent.parsing", "ToolCall": "agent.parsing", "parse_tool_calls": "agent.parsing",
    "COMPLETED": "agent.runner", "MALFORMED": "agent.runner", "MAX_STEPS": "agent.runner",
    "AgentResult": "agent.runner", "AgentRunner": "agent.runner", "AgentStep": "agent.runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agent' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
