"""What a finished job keeps in Redis: one copy of its result, and no token ids unless asked.

The job hash holds the result (or error) in full: ``GET /jobs/{id}``, ``/generate``, the
OpenAI routes and the metrics read it there. The terminal event carries a *summary*: the
same payload without its bulky parts (the text, which the token events already streamed, a
several-choice job's ``choices``, a prompt's log-probabilities, an embedding job's vectors,
token ids, an agent's trace and raw outputs), plus ``"result": "job"`` saying where the
full one is. Token ids are dropped from the stored result unless the request asked for
them (``return_token_ids``): a 2,000-token job kept them twice, as JSON numbers.
"""
from __future__ import annotations

from typing import Any

BULKY = ("text", "token_ids", "trace", "outputs", "choices", "prompt_logprobs", "embeddings")
RESULT_IN_JOB = {"result": "job"}  # the terminal event's pointer: GET /jobs/{id} has the full payload


def stored_payload(payload: dict[str, Any], keep_token_ids: bool = False) -> dict[str, Any]:
    """The payload as the job hash keeps it (``token_ids`` only when they were asked for)."""
    if keep_token_ids:
        return payload
    out = {k: v for k, v in payload.items() if k != "token_ids"}
    if isinstance(out.get("partial"), dict):
        out["partial"] = {k: v for k, v in out["partial"].items() if k != "token_ids"}
    return out


def event_summary(payload: dict[str, Any]) -> dict[str, Any]:
    """The terminal event's data: the payload without its bulky parts, and where they are."""
    out = {k: v for k, v in payload.items() if k not in BULKY}
    if isinstance(out.get("partial"), dict):
        out["partial"] = {k: v for k, v in out["partial"].items() if k not in BULKY}
    if len(out) < len(payload) or "partial" in out:
        out.update(RESULT_IN_JOB)
    return out
