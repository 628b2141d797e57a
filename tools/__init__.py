"""Tools the agent may call: a registry with JSON Schema validation, a safe calculator and
BM25 note retrieval. Tools never touch the file system (beyond the notes file read at
start) and never execute code."""
from tools.registry import (INVALID_ARGUMENTS, TOOL_ERROR, UNKNOWN_TOOL, RegistryError, Tool,
                            ToolError, ToolRegistry, ToolResult, UnknownToolError)


def create_default_registry() -> ToolRegistry:
    """The two tools MiniServe ships: ``calculator`` and ``retrieve_note``."""
    from tools.calculator import calculator_tool
    from tools.retriever import retrieve_note_tool

    registry = ToolRegistry()
    registry.register(calculator_tool())
    registry.register(retrieve_note_tool())
    return registry


__all__ = ["INVALID_ARGUMENTS", "TOOL_ERROR", "UNKNOWN_TOOL", "RegistryError", "Tool", "ToolError",
           "ToolRegistry", "ToolResult", "UnknownToolError", "create_default_registry"]
