"""Structured-output constraints as the job protocol carries them: grammar text for llguidance.

The web turns ``response_format``, ``guided_choice``, ``guided_regex`` and tool choices into
one of these grammars (and validates it); the stored job request carries it as
``{"constraint": {"kind", "grammar", "lazy", "triggers"}}``; the worker's engine compiles it
against the model's tokenizer (:mod:`engine.constrained`). The agent builds its tool-call
grammar here too, so there is one spelling of each grammar. Pure text building (stdlib
only): importing this costs nothing, and neither side needs the other's libraries.

Grammars are llguidance's Lark dialect; JSON parts use its ``%json {schema}`` with a fixed
style (``", "`` and ``": "``, no free whitespace), which is how this model writes JSON
anyway and keeps a weak model from looping on spaces.

Tool calls are written as this model writes them unprompted: a bare JSON object
``{"name": "fn", "arguments": {...}}`` (one per line when ``parallel_tool_calls``);
``core.tool_calls`` reads that form. A *lazy* constraint (``tool_choice: auto``) leaves the
model free until its text starts a call (:func:`call_trigger`): a ``<tool_call>`` tag, or
JSON whose first key is ``"name"`` with a declared tool's name as its value (bare or in a
fence). JSON that is an answer (``{"city": ...}``, ``{"name": "Ada", ...}``) stays text.
From the trigger on, the grammar, fed the text from there, holds the rest to valid calls.
The older rule (any answer opening with ``{``, any ```json fence) is kept as
``trigger="brace"`` so a benchmark can measure one against the other.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Literal

# llguidance's parser limits (LLParserLimits keyword arguments), the same in the web's check and
# the worker's compile: "fuel" bounds the work of building the lexer and of each mask step,
# the sizes bound memory. Tighter than llguidance's defaults where a client's grammar could
# make a step slow.
PARSER_LIMITS = {"initial_lexer_fuel": 1_000_000, "step_lexer_fuel": 200_000, "step_max_items": 50_000,
                 "max_lexer_states": 50_000, "max_grammar_size": 200_000, "verbose_errors": False}
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_PARALLEL_CALLS = 8
EMPTY_OBJECT = {"type": "object", "properties": {}}
# The old ("brace") lazy triggers: any answer opening with { and any ```json fence start a call.
START_TRIGGERS = ("{",)                        # only at the very start of the answer
ANYWHERE_TRIGGERS = ("<tool_call>", "```json", "```\n{")
# The call rule's spacing: JSON whitespace the model may put inside the head of a call
# (bounded, so the matcher looks only at the last few hundred bytes for a trigger).
HEAD_WS = "[ \\t\\r\\n]{0,16}"
FENCE_OPEN = "```(?:json[ \\t]{0,16}\\n?|\\n)"
TRIGGER_WINDOW = 256  # bytes: longer than any trigger match (fence + head + a 64-character name)


@dataclass(frozen=True)
class Constraint:
    """What constrains one generation. ``lazy``: free text until a trigger; then the
    grammar, which starts with the trigger text itself."""

    kind: str                        # json_object | json_schema | regex | choice | tools
    grammar: str
    lazy: bool = False
    start_triggers: tuple[str, ...] = ()  # literal, only at the start of the answer (brace rule)
    triggers: tuple[str, ...] = ()        # literal, anywhere (brace rule)
    trigger_regex: str = ""               # a Python regex over the answer's bytes, anywhere

    @property
    def key(self) -> str:
        """Cache key: a hash of the grammar text and its triggers (a compiled grammar carries both)."""
        spec = json.dumps([self.grammar, self.start_triggers, self.triggers, self.trigger_regex])
        return hashlib.sha256(spec.encode()).hexdigest()[:32]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Constraint":
        return cls(kind=str(raw["kind"]), grammar=str(raw["grammar"]), lazy=bool(raw.get("lazy", False)),
                   start_triggers=tuple(raw.get("start_triggers") or ()), triggers=tuple(raw.get("triggers") or ()),
                   trigger_regex=str(raw.get("trigger_regex") or ""))


@dataclass(frozen=True)
class ToolSpec:
    name: str
    parameters: dict[str, Any] = field(default_factory=lambda: dict(EMPTY_OBJECT))


def lark_string(text: str) -> str:
    """A Lark string literal (llguidance reads JSON string escapes)."""
    return json.dumps(text, ensure_ascii=False)


def lark_regex(pattern: str) -> str:
    """``/pattern/`` with unescaped slashes escaped."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(pattern[i:i + 2])
            i += 2
            continue
        out.append("\\/" if ch == "/" else ch)
        i += 1
    return "/" + "".join(out) + "/"


def json_block(schema: dict[str, Any]) -> str:
    """``%json {...}`` with the house JSON style (a schema's own ``x-guidance`` is replaced)."""
    styled = {k: v for k, v in schema.items() if k != "x-guidance"}
    styled["x-guidance"] = JSON_STYLE
    return "%json " + json.dumps(styled, ensure_ascii=False, separators=(",", ":"))


def json_object() -> Constraint:
    return Constraint("json_object", "start: " + json_block({"type": "object"}))


def json_schema(schema: dict[str, Any]) -> Constraint:
    return Constraint("json_schema", "start: " + json_block(schema))


def regex(pattern: str) -> Constraint:
    return Constraint("regex", "start: " + lark_regex(pattern))


def choice(options: Iterable[str]) -> Constraint:
    return Constraint("choice", "start: " + " | ".join(lark_string(o) for o in options))


def _call_head(name: str, lazy_head: bool) -> str:
    """The text before a call's arguments: the house spelling, or (lazy, name rule) the same
    with the spacing :func:`call_trigger` accepts before the name, so what triggered parses."""
    if not lazy_head:
        return lark_string('{"name": "' + name + '", "arguments": ')
    return lark_regex(r"\{" + HEAD_WS + '"name"' + HEAD_WS + ":" + HEAD_WS + '"' + re.escape(name)
                      + '", "arguments": ')


def _call_rules(tools: list[ToolSpec], lazy_head: bool = False) -> list[str]:
    rules = ["call: " + " | ".join(f"call_{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        rules.append(f"call_{i}: {_call_head(tool.name, lazy_head)} args_{i} \"}}\"")
        rules.append(f"args_{i}: {json_block(tool.parameters or EMPTY_OBJECT)}")
    return rules


def call_trigger(names: Iterable[str]) -> str:
    """Where a call starts under the name rule: a ``<tool_call>`` tag, or ``{"name": "F"``
    for a declared ``F`` (JSON spacing allowed), optionally opened by a ```json or ``` fence."""
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    head = r"\{" + HEAD_WS + '"name"' + HEAD_WS + ":" + HEAD_WS + '"(?:' + alternatives + ')"'
    return "<tool_call>|(?:" + FENCE_OPEN + ")?" + head


def _repeat(rule: str, item: str, parallel: bool) -> str:
    """``rule: item`` or, with parallel calls, up to MAX_PARALLEL_CALLS of them, one a line."""
    return f"{rule}: {item}" + (f" (\"\\n\" {item}){{0,{MAX_PARALLEL_CALLS - 1}}}" if parallel else "")


def tool_calls(tools: list[ToolSpec], parallel: bool = True, lazy: bool = False,
               trigger: Literal["name", "brace"] = "name") -> Constraint:
    """Calls to ``tools`` (one tool for a named ``tool_choice``). Eager: the answer is the
    calls. Lazy: the grammar starts at a trigger, in the bare, fenced or tagged form;
    ``trigger`` picks the rule (``name``, or the older ``brace``, see the module's note)."""
    if not lazy:
        start = "start: calls"
    else:
        start = "\n".join([
            'start: calls | "```json" FENCE_WS calls FENCE_WS "```" | "```\\n" calls FENCE_WS "```" | tagged',
            _repeat("tagged", "tag", parallel),
            'tag: "<tool_call>" FENCE_WS call FENCE_WS "</tool_call>"',
            "FENCE_WS: /[ \\t]*\\n?/"])
    by_name = lazy and trigger == "name"
    grammar = "\n".join([start, _repeat("calls", "call", parallel), *_call_rules(tools, lazy_head=by_name)])
    if not lazy:
        return Constraint("tools", grammar)
    if by_name:
        return Constraint("tools", grammar, lazy=True, trigger_regex=call_trigger(t.name for t in tools))
    return Constraint("tools", grammar, lazy=True, start_triggers=START_TRIGGERS, triggers=ANYWHERE_TRIGGERS)
