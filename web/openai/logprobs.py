"""The engine's per-token log-probabilities as OpenAI's ``logprobs`` object.

The worker stores token ids and numbers (``engine.logprobs``); the web turns ids into
OpenAI's ``token`` (the token's text) and ``bytes`` (its exact UTF-8 bytes: one token of a
byte-level BPE may hold part of a character, which ``token`` shows as U+FFFD while
``bytes`` keeps it) with the model's own ``tokenizer.json``.
"""
from __future__ import annotations

import functools
from typing import Any

from web.context import ctx


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character a byte is written as -> the byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def token_bytes(tokenizer: Any, token_id: int) -> list[int]:
    piece = tokenizer.id_to_token(int(token_id)) if tokenizer is not None else None
    if piece is None:
        return []
    decoder = _byte_decoder()
    if all(ch in decoder for ch in piece):
        return [decoder[ch] for ch in piece]
    return list(piece.encode("utf-8"))  # an added token written as itself


def _one(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    raw = token_bytes(tokenizer, token_id)
    return {"token": bytes(raw).decode("utf-8", errors="replace"), "logprob": logprob, "bytes": raw}


def openai_logprobs(entries: list[dict[str, Any]] | None, model: str | None = None) -> dict[str, Any]:
    """``{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...], "refusal": None}``,
    the tokens spelled by ``model``'s tokenizer (the job's; None: the web's own)."""
    found = ctx().budget.model(model)
    tokenizer = found.tokenizer if found is not None else None
    content = [{**_one(tokenizer, e["token_id"], e["logprob"]),
                "top_logprobs": [_one(tokenizer, i, lp) for i, lp in e.get("top") or []]}
               for e in entries or []]
    return {"content": content, "refusal": None}
