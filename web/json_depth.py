"""JSON from a client, parsed once and checked: for request bodies and JSON held in strings.

Two things in a parsed value would crash whatever walks it later, so every JSON the web
accepts goes through :func:`parse_json`, which finds both in one iterative walk:

- nesting: Python's parser recurses (a body a thousand levels deep raises
  ``RecursionError``), and so do validation, ``jsonschema``, the chat template and the
  worker. A ``RecursionError`` in the C parser is already "too deep"; past that, the walk
  measures the depth without recursing (:class:`JsonTooDeep`).
- text that is not Unicode: JSON's ``"\\ud800"`` escape makes a lone surrogate, which no
  encoder (the tokenizer, Redis, the response) accepts. Bytes that are not UTF-8 are read
  with ``surrogateescape``, so they end up as lone surrogates too and are named by field
  the same way (:class:`InvalidText`).
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterable

MAX_JSON_DEPTH = 64  # containers inside containers; real requests (tool schemas included) stay far below
_SURROGATE = re.compile("[\ud800-\udfff]")


class JsonTooDeep(ValueError):
    """The JSON nests containers more than :data:`MAX_JSON_DEPTH` levels deep."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"JSON nested more than {limit} levels deep")
        self.limit = limit


class InvalidText(ValueError):
    """A string (or an object key) that is not valid Unicode; ``field`` is its dotted path."""

    def __init__(self, path: tuple[Any, ...]) -> None:
        self.field = ".".join(_printable(str(part)) for part in path)
        super().__init__("not valid Unicode text (a lone surrogate, or bytes that are not UTF-8)")


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _children(item: Any) -> Iterable[tuple[Any, Any]] | None:
    if isinstance(item, dict):
        return item.items()
    if isinstance(item, list):
        return enumerate(item)
    return None


def check_value(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise :class:`JsonTooDeep` or :class:`InvalidText` (naming the first bad string's
    path) for a parsed JSON value; no recursion, one pass."""
    if isinstance(value, str) and _SURROGATE.search(value):
        raise InvalidText(())
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 1, ())]
    while stack:
        item, level, path = stack.pop()
        pairs = _children(item)
        if pairs is None:
            continue
        if level > max_depth:
            raise JsonTooDeep(max_depth)
        for key, child in pairs:
            if isinstance(key, str) and _SURROGATE.search(key):
                raise InvalidText((*path, key))
            if isinstance(child, str):
                if _SURROGATE.search(child):
                    raise InvalidText((*path, key))
            elif isinstance(child, (dict, list)):
                stack.append((child, level + 1, (*path, key)))


def depth(value: Any) -> int:
    """Nesting depth of containers (a scalar is 0, ``[]`` is 1), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        pairs = _children(item)
        if pairs is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for _, child in pairs if isinstance(child, (dict, list)))
    return deepest


def _text(data: str | bytes) -> str:
    if isinstance(data, str):
        return data
    return data.decode(json.detect_encoding(data), "surrogateescape")


def parse_json(data: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` and :func:`check_value`: raises :class:`JsonTooDeep`,
    :class:`InvalidText` or (not JSON) another ``ValueError``. The walk costs about what
    the depth walk alone did (1 ms more per 400 KB body of 3,000 messages)."""
    try:
        value = json.loads(_text(data))
    except RecursionError:
        raise JsonTooDeep(max_depth) from None
    check_value(value, max_depth)
    return value
