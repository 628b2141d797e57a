"""The tool-calling agent: a bounded loop over a chat model protocol and the tool registry."""
from agent.model import ChatModel, EngineChatModel
from agent.parsing import ParsedOutput, ToolCall, parse_tool_calls
from agent.runner import (COMPLETED, MALFORMED, MAX_STEPS, AgentResult, AgentRunner, AgentStep)

__all__ = ["COMPLETED", "MALFORMED", "MAX_STEPS", "AgentResult", "AgentRunner", "AgentStep",
           "ChatModel", "EngineChatModel", "ParsedOutput", "ToolCall", "parse_tool_calls"]
