"""Turn a stored job request (plain JSON written by the web) into engine requests.

The stored shape (see docs/api.md): ``{"messages": [...], "prefix": str|None,
"sampling": {max_new_tokens, temperature, top_p, top_k, repetition_penalty, seed, stop,
presence_penalty?, frequency_penalty?, logit_bias? [[id, bias], ...], logprobs?, top_logprobs?},
"method": str, "tools": [...]|None, "max_steps": int, "speculative": bool|None}``.
"""
from __future__ import annotations

from typing import Any

from core.grammar import Constraint
from engine.types import GenerationRequest, SamplingParams
from worker.job_runner import BadJobRequest

_SAMPLING_FIELDS = set(SamplingParams.__dataclass_fields__)


def sampling_from(stored: dict[str, Any], default_max_new_tokens: int) -> SamplingParams:
    raw = dict(stored.get("sampling") or {})
    unknown = set(raw) - _SAMPLING_FIELDS
    if unknown:
        raise BadJobRequest(f"unknown sampling fields: {sorted(unknown)}")
    stop = raw.get("stop") or ()
    raw["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
    raw["logit_bias"] = _bias(raw.get("logit_bias"))
    raw = {k: v for k, v in raw.items() if v is not None or k == "repetition_penalty"}
    raw.setdefault("max_new_tokens", default_max_new_tokens)
    return SamplingParams(**raw)


def _bias(raw: Any) -> tuple[tuple[int, float], ...]:
    """``[[id, bias], ...]`` (JSON has no tuples) as the engine's pairs."""
    pairs = raw or []
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise BadJobRequest("logit_bias must be a list of [token id, bias] pairs")
    try:
        return tuple((int(token), float(value)) for token, value in pairs)
    except (TypeError, ValueError):
        raise BadJobRequest("logit_bias must be a list of [token id, bias] pairs") from None


def generation_request_from(stored: dict[str, Any], default_max_new_tokens: int,
                            default_method: str = "official") -> GenerationRequest:
    messages = stored.get("messages")
    if not messages and stored.get("prompt"):
        messages = [{"role": "user", "content": stored["prompt"]}]
    if not messages:
        raise BadJobRequest("the job request has no messages")
    return GenerationRequest(
        messages=list(messages),
        sampling=sampling_from(stored, default_max_new_tokens),
        method=stored.get("method") or default_method,
        prefix=stored.get("prefix"),
        tools=stored.get("tools"),
        speculative=_flag(stored.get("speculative")),
        constraint=Constraint.from_dict(stored["constraint"]) if stored.get("constraint") else None,
    )


def _flag(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise BadJobRequest("speculative must be true, false or null")
