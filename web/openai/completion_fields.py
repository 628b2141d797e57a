"""Every top-level field of a ``/v1/completions`` body, and what MiniServe does with it.

The same three kinds as the chat table (:mod:`web.openai.fields`, whose check runs this
table too): honoured, accepted with no effect, refused with a 400 naming the field. The
test that walks the ``openai`` client's ``CompletionCreateParams`` is
``tests/web/test_openai_completions.py``; docs/api.md prints the table.
"""
from __future__ import annotations

from typing import Any

from web.openai.fields import OPENAI_SAMPLING, FieldRule, check_fields, honoured, no_effect, refused, sampling_rules

COMPLETION_FIELDS: dict[str, FieldRule] = {
    **sampling_rules(OPENAI_SAMPLING),
    "prompt": honoured("a string, or a list of strings (one choice per prompt, n each); token ids: 400"),
    "model": honoured("an id from GET /v1/models picks the model; empty = the cluster's default; unknown: 404"),
    "max_tokens": honoured("the job's max_new_tokens; omitted = 16, as OpenAI"),
    "stream": honoured("text_completion chunks, data: [DONE] last"),
    "stream_options": honoured("include_usage"),
    "n": honoured("1..16 choices per prompt, in one job; paged: they share the prompt's KV blocks"),
    "best_of": refused("no server-side ranking; only null, 1 or n"),  # its accepted values depend on n: checked below
    "echo": honoured("the prompt before the answer (and its tokens' logprobs, the first null)"),
    "logprobs": honoured("0..20: tokens, token_logprobs, top_logprobs, text_offset"),
    "suffix": honoured("fill-in-the-middle with the tokenizer's FIM tokens; none: 400"),
    "user": no_effect("an end-user id; not logged", str),
}


def _best_of_changes_nothing(body: dict[str, Any]) -> bool:
    """``best_of`` = n (or 1, or null) asks for exactly the choices returned."""
    best_of, n = body.get("best_of"), body.get("n")
    return best_of is None or (type(best_of) is int and best_of in (1, n if n is not None else 1))


def check_completion_fields(body: Any) -> None:
    """Raise ``ValueError("<field>: ...")`` for an unknown or refused field (a 400 naming it)."""
    if not isinstance(body, dict):
        return
    if not _best_of_changes_nothing(body):
        raise ValueError(f"best_of: not supported ({COMPLETION_FIELDS['best_of'].note})")
    check_fields({k: v for k, v in body.items() if k != "best_of"}, COMPLETION_FIELDS)
