"""Where a rendered chat prompt's system block ends: one rule for the worker (engine/prompt.py)
and the web (web/prompt_text.py), so the prefix the worker caches and the key the web routes
by name the same tokens.

The block is the rendered system part (the given one or the template's default, tools
included) up to the first user header. When the user speaks right after the system part,
the full prompt's own text shows where it ends (the block does not depend on what follows
it); otherwise a probe (the system part and a user "x") is rendered to find it. Its length in
tokens comes from the full prompt's encoding: the index of the token that starts where the
block ends (the ``<|im_start|>`` special token), so the text is encoded once.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

MARKER = "<|im_start|>user"  # the user header of the chat templates MiniServe renders


def probe_needed(messages: Sequence[dict[str, Any]]) -> bool:
    """True when the message after the system part (if any) is not the user's."""
    start = 1 if messages and messages[0].get("role") == "system" else 0
    following = messages[start:start + 1]
    return not (following and following[0].get("role") == "user")


def system_block(messages: Sequence[dict[str, Any]], full_text: str,
                 render_probe: Callable[[list[dict[str, Any]]], str]) -> str:
    """The system block's text, a prefix of ``full_text`` ("" when the template shows none).
    ``render_probe(messages)`` renders without the generation prompt."""
    if probe_needed(messages):
        system = [dict(m) for m in messages[:1] if m.get("role") == "system"]
        text = render_probe(system + [{"role": "user", "content": "x"}])
    else:
        text = full_text
    cut = text.find(MARKER)
    block = text[:cut] if cut > 0 else ""
    return block if block and full_text.startswith(block) else ""


def tokens_before(offsets: Sequence[tuple[int, int]], cut: int) -> int:
    """How many tokens cover ``text[:cut]``: the index of the token that starts at ``cut``
    (0 when none does: no token boundary there, so no block)."""
    if cut <= 0:
        return 0
    for index, (start, _end) in enumerate(offsets):
        if start >= cut:
            return index if start == cut else 0
    return 0
