"""Every top-level field of a ``/v1/completions`` body, and what MiniServe does with it.

The same three kinds as the chat table (:mod:`web.openai.fields`, whose check runs this
table too): honoured, accepted with no effect, refused with a 400 naming the field. The
test that walks the ``openai`` client's ``CompletionCreateParams`` is
``tests/web/test_openai_completions.py``; docs/api.md prints the table.
"""
from __future__ import annotations

from typing import Any

from web.openai.fields import FieldRule, check_fields, honoured, no_effect, refused

COMPLETION_FIELDS: dict[str, FieldRule] = {
    "prompt": honoured("a string, or a list of strings (one choice per prompt, n each); token ids: 400"),
    "model": honoured("an id from GET /v1/models picks the model; empty = the cluster's default; unknown: 404"),
    "max_tokens": honoured("the job's max_new_tokens; omitted = 16, as OpenAI"),
    "temperature": honoured("omitted = 0 (greedy), unlike OpenAI's 1"),
    "top_p": honoured("nucleus sampling"),
    "seed": honoured("seeds the sampler; choice i of a prompt: seed + i"),
    "stop": honoured("a string or up to 8"),
    "stream": honoured("text_completion chunks, data: [DONE] last"),
    "stream_options": honoured("include_usage"),
    "n": honoured("1..16 choices per prompt, in one job; paged: they share the prompt's KV blocks"),
    "best_of": refused("no server-side ranking; only null, 1 or n"),  # its accepted values depend on n: checked below
    "echo": honoured("the prompt before the answer (and its tokens' logprobs, the first null)"),
    "logprobs": honoured("0..20: tokens, token_logprobs, top_logprobs, text_offset"),
    "suffix": honoured("fill-in-the-middle with the tokenizer's FIM tokens; none: 400"),
    "presence_penalty": honoured("-2..2, over the generated tokens; on top of repetition_penalty"),
    "frequency_penalty": honoured("-2..2, over the generated tokens; on top of repetition_penalty"),
    "logit_bias": honoured("token id -> -100..100 added to the logits (-100 bans)"),
    "user": no_effect("an end-user id; not logged", str),
    "generation_method": honoured("official | no_cache | custom_cache | prefix_cache | paged", extension=True),
    "top_k": honoured("0 = off", extension=True),
    "repetition_penalty": honoured("null = the model's default", extension=True),
    "speculative": honoured("prompt-lookup speculative decoding on/off", extension=True),
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
