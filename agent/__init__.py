"""The tool-calling agent: a bounded loop over a chat model protocol and the tool registry.

Names are imported on first access (PEP 562), so importing one part does not pull in the
engine's types. Tool-call parsing lives in :mod:`core.tool_calls` (the web reads it too).
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ChatModel": "agent.model", "EngineChatModel": "agent.model",
    "ParsedOutput": "core.tool_calls", "ToolCall": "core.tool_calls", "parse_tool_calls": "core.tool_calls",
    "COMPLETED": "agent.runner", "MALFORMED": "agent.runner", "MAX_STEPS": "agent.runner",
    "AgentResult": "agent.runner", "AgentRunner": "agent.runner", "AgentStep": "agent.runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agent' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
