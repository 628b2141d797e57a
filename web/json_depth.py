"""JSON parsing with a nesting bound, for request bodies and JSON held in strings.

Python's parser recurses: a body nested a thousand levels deep raises ``RecursionError``
(a 500), and anything that later walks the value (validation, the chat template, the
worker) recurses again. So every JSON the web accepts goes through :func:`loads_bounded`:
the C parser first (a ``RecursionError`` there is already "too deep"), then an iterative
walk that measures the depth without recursing.
"""
from __future__ import annotations

import json
from typing import Any

MAX_JSON_DEPTH = 64  # containers inside containers; real requests (tool schemas included) stay far below


class JsonTooDeep(ValueError):
    """The JSON nests containers more than :data:`MAX_JSON_DEPTH` levels deep."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"JSON nested more than {limit} levels deep")
        self.limit = limit


def depth(value: Any) -> int:
    """Nesting depth of containers (a scalar is 0, ``[]`` is 1), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def loads_bounded(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` that raises :class:`JsonTooDeep` (a ``ValueError``) past ``max_depth``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JsonTooDeep(max_depth) from None
    if depth(value) > max_depth:
        raise JsonTooDeep(max_depth)
    return value
