"""Every top-level field of a ``/v1/responses`` body (OpenAI's ``ResponseCreateParams``), and
what MiniServe does with it, in the style of :mod:`web.openai.fields`: ``honoured``,
``no_effect`` (accepted, type-checked, changes nothing here) or ``refused`` (a value other
than the default is a 400 naming the field). A field in no row is a 400 too. The table drives
the request model's first check, the test that walks the ``openai`` client's own list
(``tests/web/test_responses_fields.py``) and the table in docs/api.md.
"""
from __future__ import annotations

from typing import Any

from web.openai.fields import FieldRule, check_fields, exactly, honoured, no_effect, refused, sampling_rules

RESPONSE_FIELDS: dict[str, FieldRule] = {
    **sampling_rules(frozenset({"temperature", "top_p"})),  # the Responses API's own sampling fields
    "input": honoured("a string, or items: messages (system, developer as system, user, assistant; "
                      "input_text/output_text parts), function_call and function_call_output"),
    "instructions": honoured("a system message before everything else; not carried over by "
                             "previous_response_id (as OpenAI)"),
    "model": honoured("id, alias or name:tag; empty = the cluster's default; one model: any name; several: unknown 404"),
    "max_output_tokens": honoured("the job's max_new_tokens; reaching it: status incomplete"),
    "stream": honoured("Responses events, response.created ... response.completed, each with sequence_number"),
    "tools": honoured("function tools, rendered by the chat template; other tool types: 400"),
    "tool_choice": honoured("none | auto | required | {type: function, name}, held by a grammar"),
    "parallel_tool_calls": honoured("false: at most one call"),
    "text": honoured("format: text | json_object | json_schema, held by a grammar; verbosity: only null"),
    "store": honoured("true (default): the response is its job, readable at GET /v1/responses/{id} and "
                      "usable as previous_response_id while the job is kept; false: neither"),
    "previous_response_id": honoured("a stored, completed response: its input and output come before this input"),
    "stream_options": no_effect("include_obfuscation: no obfuscation padding is sent", dict),
    "metadata": no_effect("not stored", dict),
    "user": no_effect("an end-user id; not logged", str),
    "safety_identifier": no_effect("an end-user id; not logged", str),
    "service_tier": no_effect("one tier here", str),
    "prompt_cache_key": no_effect("prompt caching is automatic (prefix routing)", str),
    "prompt_cache_retention": no_effect("prompt caching is automatic", str),
    "prompt_cache_options": no_effect("prompt caching is automatic", dict),
    "background": honoured("true: answered at once (status queued); poll GET /v1/responses/{id}, cancel with "
                           "POST /v1/responses/{id}/cancel; needs store"),
    "background_options": refused("no background mode"),
    "include": refused("no extra output data; only []", exactly([])),
    "top_logprobs": refused("no log-probabilities on /v1/responses (use /v1/chat/completions); only 0", exactly(0)),
    "truncation": refused("input is never dropped (too long: a 400); only \"disabled\"", exactly("disabled")),
    "reasoning": refused("the model does not reason in a separate channel"),
    "max_tool_calls": refused("calls are capped by parallel_tool_calls only"),
    "conversation": refused("conversations are not kept; use previous_response_id"),
    "context_management": refused("no context management"),
    "prompt": refused("no stored prompt templates"),
    "moderation": refused("no moderation"),
    "image": refused("no image generation"),
    "access_programs": refused("no access programs"),
}


def check_response_fields(body: Any) -> None:
    """Raise ``ValueError("<field>: ...")`` for an unknown or refused field (see the table)."""
    if isinstance(body, dict):
        check_fields(body, RESPONSE_FIELDS)
