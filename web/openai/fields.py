"""Every top-level field of a ``/v1/chat/completions`` body, and what MiniServe does with it.

One table drives the check the request model runs before anything else
(:func:`check_chat_fields`), the test that walks OpenAI's own list of request fields
(``tests/web/test_openai_fields.py``) and the table in docs/api.md:

- ``honoured``: the field changes the answer as OpenAI defines it (or as its extension note says);
- ``no_effect``: accepted (its type checked) and changes nothing, because it cannot change
  the answer here (``user``, ``metadata``, ``service_tier`` ...);
- ``refused``: a value other than the field's default is a 400 naming the field and saying it
  is not supported, rather than an answer that silently differs from what was asked.

A field in no row is a 400 too (``unknown field``): nothing is silently dropped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from web.sampling_base import SAMPLING_NOTES

Kind = Literal["honoured", "no_effect", "refused"]


def _null(value: Any) -> bool:
    return value is None


def exactly(*defaults: Any) -> Callable[[Any], bool]:
    """Accepts null and exactly these JSON values (``False`` is not ``0``)."""
    return lambda value: value is None or any(type(value) is type(d) and value == d for d in defaults)


@dataclass(frozen=True)
class FieldRule:
    kind: Kind
    note: str
    accepts: Callable[[Any], bool] = _null     # refused fields: the values that change nothing
    types: tuple[type, ...] = ()               # no_effect fields: the JSON types accepted (null too)
    extension: bool = False                    # a MiniServe (or vLLM) extension, not OpenAI's


def honoured(note: str, extension: bool = False) -> FieldRule:
    return FieldRule("honoured", note, extension=extension)


def no_effect(note: str, *types: type) -> FieldRule:
    return FieldRule("no_effect", note, types=types)


def refused(note: str, accepts: Callable[[Any], bool] = _null) -> FieldRule:
    return FieldRule("refused", note, accepts=accepts)


def sampling_rules(openai: frozenset[str]) -> dict[str, FieldRule]:
    """The rows of the sampling fields every surface shares (``web.sampling_base``): all
    honoured, each a MiniServe extension unless ``openai`` (this endpoint's OpenAI fields) has it."""
    return {name: honoured(note, extension=name not in openai) for name, note in SAMPLING_NOTES.items()}


OPENAI_SAMPLING = frozenset({"temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty",
                             "logit_bias"})  # chat's and completions' own; the rest are extensions
CHAT_FIELDS: dict[str, FieldRule] = {
    **sampling_rules(OPENAI_SAMPLING),
    "messages": honoured("system, developer (as system), user, assistant (with tool_calls), tool; text only"),
    "model": honoured("id, alias or name:tag; empty = the cluster's default; one model: any name; several: unknown 404"),
    "max_completion_tokens": honoured("the job's max_new_tokens (wins over max_tokens)"),
    "max_tokens": honoured("the job's max_new_tokens"),
    "stream": honoured("OpenAI chunks, data: [DONE] last"),
    "stream_options": honoured("include_usage"),
    "tools": honoured("function tools, rendered by the chat template"),
    "tool_choice": honoured("none | auto | required | a named function, held by a grammar"),
    "parallel_tool_calls": honoured("false: at most one call"),
    "response_format": honoured("text | json_object | json_schema, held by a grammar"),
    "n": honoured("1..16 choices in one job (seed + i each); paged: they share the prompt's KV blocks"),
    "logprobs": honoured("after penalties and logit_bias, before the grammar mask and temperature/top-k/top-p"),
    "top_logprobs": honoured("0..20 alternatives per token; needs logprobs: true"),
    "store": refused("completions are not stored; only false", exactly(False)),
    "modalities": refused("text only; only [\"text\"]", exactly(["text"])),
    "audio": refused("no audio output"),
    "prediction": refused("predicted outputs are not supported"),
    "web_search_options": refused("no web search"),
    "functions": refused("deprecated by OpenAI: use tools"),
    "function_call": refused("deprecated by OpenAI: use tool_choice"),
    "reasoning_effort": refused("the model does not reason in a separate channel"),
    "verbosity": refused("no verbosity control"),
    "moderation": refused("no moderation"),
    "user": no_effect("an end-user id; not logged", str),
    "safety_identifier": no_effect("an end-user id; not logged", str),
    "metadata": no_effect("not stored", dict),
    "service_tier": no_effect("one tier here", str),
    "prompt_cache_key": no_effect("prompt caching is automatic (prefix routing)", str),
    "prompt_cache_retention": no_effect("prompt caching is automatic", str),
    "prompt_cache_options": no_effect("prompt caching is automatic", dict),
    "guided_choice": honoured("the answer is one of the strings", extension=True),
    "guided_regex": honoured("the answer matches the regex", extension=True),
}


def check_chat_fields(body: Any) -> None:
    """Raise ``ValueError("<field>: ...")`` (a 400 naming the field) for an unknown field,
    a refused field with a value other than its default, or a no-effect field of the wrong type."""
    if not isinstance(body, dict):
        return  # the model's own validation says what is wrong
    if body.get("top_logprobs") is not None and body.get("logprobs") is not True:
        raise ValueError("top_logprobs: needs logprobs: true")
    check_fields(body, CHAT_FIELDS)


def check_fields(body: dict[str, Any], table: dict[str, FieldRule]) -> None:
    """:func:`check_chat_fields`'s walk over any endpoint's table (``/v1/completions``, ``/v1/responses``)."""
    for name, value in body.items():
        rule = table.get(name)
        if rule is None:
            raise ValueError(f"{name}: unknown field, not supported")
        if rule.kind == "refused" and not rule.accepts(value):
            raise ValueError(f"{name}: not supported ({rule.note})")
        if rule.kind == "no_effect" and value is not None and not isinstance(value, rule.types):
            raise ValueError(f"{name}: must be {' or '.join(t.__name__ for t in rule.types)} or null")
