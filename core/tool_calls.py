"""Find tool calls in raw model text, in every shape small models actually write.

Qwen2.5's template asks for ``<tool_call>{json}</tool_call>``, but the 0.5B coder model
mostly answers with a bare JSON object or a ```json fenced block, sometimes drops the
closing tag or a closing brace, sometimes encodes ``arguments`` as a JSON string or names
the key ``parameters``. All of these are accepted. Text that clearly *tries* to call a
tool but cannot be read (a ``<tool_call>`` tag with broken JSON) is reported as malformed,
which the agent treats as a distinct outcome from a plain answer.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

_TAG_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.S)
_FENCE_RE = re.compile(r"```[a-zA-Z]*[ \t]*\n?(.*?)(?:```|\Z)", re.S)
_NAME_KEYS = ("name", "tool", "tool_name", "function")
_ARG_KEYS = ("arguments", "parameters", "args", "input", "tool_input")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedOutput:
    """``calls`` found in the text; ``content`` is the text left around them."""

    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""
    malformed: bool = False
    error: str | None = None
    format: str | None = None  # tag | fenced | bare


def parse_tool_calls(text: str, known_tools: Iterable[str] = ()) -> ParsedOutput:
    known = set(known_tools)
    if "<tool_call>" in text:
        return _parse_segments(text, _TAG_RE, "tag", known, strict=True)
    if "```" in text:
        fenced = _parse_segments(text, _FENCE_RE, "fenced", known, strict=False)
        if fenced.calls or fenced.malformed:
            return fenced
    return _parse_bare(text, known)


def _parse_segments(text: str, pattern: re.Pattern[str], fmt: str, known: set[str],
                    strict: bool) -> ParsedOutput:
    calls: list[ToolCall] = []
    for match in pattern.finditer(text):
        objects = _json_values(match.group(1))
        found = [c for obj in objects for c in _calls_from(obj, known)]
        if not found and (strict or _looks_like_call(match.group(1))):
            return ParsedOutput(content=text.strip(), malformed=True, format=fmt,
                                error=f"unreadable tool call in {fmt} block")
        calls += found
    content = pattern.sub("", text).strip() if calls else text.strip()
    return ParsedOutput(calls=calls, content=content, format=fmt if calls else None)


def _parse_bare(text: str, known: set[str]) -> ParsedOutput:
    calls: list[ToolCall] = []
    spans: list[tuple[int, int]] = []
    i = 0
    while (start := _next_open(text, i)) != -1:
        value, end = _decode_at(text, start)
        found = _calls_from(value, known) if value is not None else []
        if found:
            calls += found
            spans.append((start, end))
            i = end
        else:
            i = start + 1
    if not calls:
        lead = len(text) - len(text.lstrip())
        if text[lead:lead + 1] == "{" and _decode_at(text, lead)[0] is None and _looks_like_call(text):
            return ParsedOutput(content=text.strip(), malformed=True, format="bare",
                                error="unreadable JSON tool call")
        return ParsedOutput(content=text.strip())
    content = "".join(text[a:b] for a, b in _gaps(spans, len(text))).strip()
    return ParsedOutput(calls=calls, content=content, format="bare")


def _gaps(spans: list[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    edges, prev = [], 0
    for a, b in spans:
        edges.append((prev, a))
        prev = b
    return edges + [(prev, length)]


def _json_values(segment: str) -> list[Any]:
    """Every JSON value in a segment, repairing a missing closing brace or two."""
    values, i = [], 0
    while (start := _next_open(segment, i)) != -1:
        value, end = _decode_at(segment, start)
        if value is None:
            i = start + 1
            continue
        values.append(value)
        i = end
    return values


def _next_open(text: str, i: int) -> int:
    starts = [p for p in (text.find("{", i), text.find("[", i)) if p != -1]
    return min(starts) if starts else -1


def _decode_at(text: str, start: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        pass
    tail = text[start:].rstrip()
    for extra in ("}", "}}", "\"}}", "]"):  # truncated output: close what is open
        try:
            value = json.loads(tail + extra)
            return value, len(text)
        except json.JSONDecodeError:
            continue
    return None, start + 1


def _calls_from(value: Any, known: set[str]) -> list[ToolCall]:
    if isinstance(value, list):
        return [c for item in value for c in _calls_from(item, known)]
    if not isinstance(value, dict):
        return []
    if isinstance(value.get("function"), dict):  # OpenAI shape {"type": "function", "function": {...}}
        return _calls_from(value["function"], known)
    if isinstance(value.get("tool_calls"), list):
        return _calls_from(value["tool_calls"], known)
    name = next((value[k] for k in _NAME_KEYS if isinstance(value.get(k), str)), None)
    arg_key = next((k for k in _ARG_KEYS if k in value), None)
    if not name or (arg_key is None and name not in known):
        return []
    arguments = _arguments(value.get(arg_key, {}) if arg_key else {})
    if arguments is None:
        return []
    return [ToolCall(name=name.strip(), arguments=arguments)]


def _arguments(raw: Any) -> dict[str, Any] | None:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            decoded = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return None
        return decoded if isinstance(decoded, dict) else None
    return None


def _looks_like_call(segment: str) -> bool:
    return bool(re.search(r"[\"'](name|arguments|parameters)[\"']\s*:", segment))
