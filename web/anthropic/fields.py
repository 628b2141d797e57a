"""Every top-level field of a ``/v1/messages`` body (the ``anthropic`` client's
``MessageCreateParams``), and what MiniServe does with it, in the style of
:mod:`web.openai.fields`: ``honoured``, ``no_effect`` (accepted, type-checked, changes nothing
here) or ``refused`` (any value but null is a 400 naming the field). A field in no row is a
400 too. The table drives the request model's first check, the test that walks the client's
own list of fields (``tests/web/test_anthropic_messages.py``) and the table in docs/api.md.

The sampling fields every surface shares (``web.sampling_base``) are all honoured:
``temperature``, ``top_p`` and ``top_k`` are Anthropic's own (the newest client sends them
through ``extra_body``), the others (``seed``, ``repetition_penalty``, the penalties,
``logit_bias``, ``stop`` beside ``stop_sequences``, ``generation_method``, ``speculative``)
MiniServe's extensions, as on the OpenAI routes.
"""
from __future__ import annotations

from typing import Any

from web.openai.fields import FieldRule, check_fields, honoured, no_effect, refused, sampling_rules

MESSAGE_FIELDS: dict[str, FieldRule] = {
    **sampling_rules(frozenset({"temperature", "top_p", "top_k"})),  # Anthropic's own sampling fields
    "model": honoured("id, alias or name:tag; one model: any name (a Claude name too); several: unknown 404"),
    "messages": honoured("user and assistant turns: string content, or text, tool_use (assistant) and "
                         "tool_result (user) blocks; other block types: 400"),
    "system": honoured("a string or text blocks: the first system message"),
    "max_tokens": honoured("required; the job's max_new_tokens (1 up to MINISERVE_MAX_NEW_TOKENS_CAP)"),
    "stop_sequences": honoured("up to 8 stop strings; the one that ended the answer is stop_sequence"),
    "stream": honoured("Anthropic's events, message_start ... message_stop"),
    "tools": honoured("custom tools (name, description, input_schema), rendered by the chat template; "
                      "server tools: 400"),
    "tool_choice": honoured("auto | any | tool (named) | none, held by a grammar; "
                            "disable_parallel_tool_use: at most one call"),
    "metadata": no_effect("user_id: an end-user id; not logged", dict),
    "cache_control": no_effect("prompt caching is automatic (prefix cache); reads are "
                               "usage.cache_read_input_tokens", dict),
    "thinking": refused("the model does not think in a separate channel"),
    "service_tier": refused("one tier here"),
    "container": refused("no code-execution containers"),
    "context_management": refused("no context management"),
    "mcp_servers": refused("no MCP connector"),
    "output_config": refused("no output configuration (use tool_choice for structured answers)"),
    "output_format": refused("no output format (use tool_choice for structured answers)"),
    "speed": refused("one speed here"),
    "diagnostics": refused("no cache diagnostics"),
    "inference_geo": refused("one place here"),
    "user_profile_id": refused("no user profiles"),
    "workspace_id": refused("no workspaces"),
}
COUNT_FIELDS: dict[str, FieldRule] = {name: MESSAGE_FIELDS[name] for name in (
    "model", "messages", "system", "tools", "tool_choice", "cache_control", "thinking", "output_config",
    "speed", "user_profile_id", "workspace_id")}


def check_message_fields(body: Any) -> None:
    """Raise ``ValueError("<field>: ...")`` for an unknown or refused field (see the table)."""
    if isinstance(body, dict):
        check_fields(body, MESSAGE_FIELDS)


def check_count_fields(body: Any) -> None:
    if isinstance(body, dict):
        check_fields(body, COUNT_FIELDS)
