"""Structured-output requests to a checked grammar, before anything is queued.

``response_format`` (``json_object``, ``json_schema``), ``guided_choice``, ``guided_regex``
and tool choices become a :class:`core.grammar.Constraint`. The web checks it here, in two
steps, so a bad one is a 4xx naming the field and never reaches a worker:

1. our own bounds, cheap, before any parsing library sees it: schema size and nesting depth,
   number and length of choices, regex length; a JSON Schema must itself be valid
   (``jsonschema.check_schema``);
2. llguidance's own grammar check (``LLMatcher.validate_grammar``, no tokenizer: about a
   millisecond, GIL released), with the same parser limits the worker compiles under: it
   rejects features llguidance does not implement (the message lists them), broken regexes,
   unresolvable ``$ref`` s, recursion and oversized grammars.

The web does not load the tokenizer for llguidance (2-3 s and ~200 MB per web process); the
worker compiles against it under the same limits, and a grammar that fails there ends its
job ``failed`` with code ``grammar_error`` (a 4xx to a waiting client). llguidance is a
3 MB Rust extension with no dependencies, so importing it keeps the web light and torch-free.
"""
from __future__ import annotations

import json
from typing import Any

import jsonschema
import llguidance
from jsonschema.validators import validator_for

from core import grammar
from core.grammar import Constraint, ToolSpec
from web.errors import ApiError
from web.json_depth import depth

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 48
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1024
MAX_REGEX_CHARS = 4096
# A lower bound no answer within the token cap can meet only makes the grammar huge
# (minItems 100000 takes seconds to compile): refused up front.
MAX_LOWER_BOUND = 4096
LOWER_BOUNDS = ("minItems", "minLength", "minProperties", "minContains")


def parser_limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(**grammar.PARSER_LIMITS)


def _bad(field: str, message: str, code: str = "validation_error") -> ApiError:
    return ApiError(422, code, f"{field}: {message}", field=field)


def _too_large_bound(schema: Any) -> str | None:
    """The first ``minItems``-like keyword above :data:`MAX_LOWER_BOUND`, if any."""
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in LOWER_BOUNDS:
                value = item.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_LOWER_BOUND:
                    return f"{key} {value} (at most {MAX_LOWER_BOUND})"
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def check_schema(schema: Any, field: str) -> dict[str, Any]:
    """A JSON Schema within our bounds and valid as a schema, or a 422 naming ``field``."""
    if not isinstance(schema, dict):
        raise _bad(field, "must be a JSON Schema object")
    if depth(schema) > MAX_SCHEMA_DEPTH:
        raise _bad(field, f"nested deeper than {MAX_SCHEMA_DEPTH} levels", "schema_too_complex")
    size = len(json.dumps(schema, ensure_ascii=False))
    if size > MAX_SCHEMA_BYTES:
        raise _bad(field, f"{size} bytes; at most {MAX_SCHEMA_BYTES}", "schema_too_complex")
    bound = _too_large_bound(schema)
    if bound:
        raise _bad(field, bound, "schema_too_complex")
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise _bad(field, f"not a valid JSON Schema{' at ' + where if where else ''}: {exc.message}") from None
    return schema


def validated(constraint: Constraint, field: str) -> Constraint:
    """llguidance's check of the grammar, with the worker's limits; 422 with its reason."""
    error = llguidance.LLMatcher.validate_grammar(constraint.grammar, None, limits=parser_limits())
    if error:
        reason = error.split("\n", 1)[0]
        code = "unsupported_schema_feature" if "Unimplemented" in reason else "invalid_grammar"
        raise _bad(field, reason.split(": ", 1)[-1] if reason.startswith("at ") else reason, code)
    return constraint


def from_response_format(fmt: dict[str, Any] | None, field: str = "response_format") -> Constraint | None:
    """``{"type": "text" | "json_object" | "json_schema", ...}`` (already shape-checked)."""
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt["type"] == "json_object":
        return validated(grammar.json_object(), field)
    schema_field = f"{field}.json_schema.schema"
    schema = check_schema((fmt.get("json_schema") or {}).get("schema"), schema_field)
    return validated(grammar.json_schema(schema), schema_field)


def from_choice(options: list[str], field: str = "guided_choice") -> Constraint:
    if not options or len(options) > MAX_CHOICES:
        raise _bad(field, f"give 1 to {MAX_CHOICES} strings")
    if any(not o or len(o) > MAX_CHOICE_CHARS for o in options):
        raise _bad(field, f"each choice: 1 to {MAX_CHOICE_CHARS} characters")
    return validated(grammar.choice(options), field)


def from_regex(pattern: str, field: str = "guided_regex") -> Constraint:
    if not pattern or len(pattern) > MAX_REGEX_CHARS:
        raise _bad(field, f"1 to {MAX_REGEX_CHARS} characters")
    return validated(grammar.regex(pattern), field)


def for_request(response_format: dict[str, Any] | None, guided_choice: list[str] | None,
                guided_regex: str | None) -> Constraint | None:
    """The one constraint a generation body asks for (at most one of the three)."""
    given = [name for name, value in (("response_format", response_format if response_format and
                                       response_format.get("type") != "text" else None),
                                      ("guided_choice", guided_choice), ("guided_regex", guided_regex))
             if value is not None]
    if len(given) > 1:
        raise _bad(given[1], f"give only one of {', '.join(given)}")
    if guided_choice is not None:
        return from_choice(guided_choice)
    if guided_regex is not None:
        return from_regex(guided_regex)
    return from_response_format(response_format)


def for_tools(tools: list[dict[str, Any]], only: str | None, required: bool, parallel: bool,
              field: str = "tools") -> Constraint:
    """Calls to the request's functions: eager for ``required`` or a named function, lazy
    (trigger-started) for ``auto``. Schemas are checked by ``web.openai.tool_calls``."""
    specs = []
    for i, tool in enumerate(tools):
        function = tool["function"]
        if only is not None and function["name"] != only:
            continue
        params = function.get("parameters") or dict(grammar.EMPTY_OBJECT)
        where = f"{field}.{i}.function.parameters"
        validated(grammar.json_schema(check_schema(params, where)), where)
        specs.append(ToolSpec(function["name"], params))
    constraint = grammar.tool_calls(specs, parallel=parallel and only is None, lazy=not (required or only))
    return validated(constraint, field)
