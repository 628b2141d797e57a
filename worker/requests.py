"""Turn a stored job request (plain JSON written by the web) into engine requests.

The stored shape (see docs/api.md): ``{"messages": [...], "prefix": str|None,
"sampling": {max_new_tokens, temperature, top_p, top_k, repetition_penalty, seed, stop, the other
knobs of core/sampling_fields.py when set (presence_penalty, min_p, min_tokens, ...),
logit_bias? [[id, bias], ...], logprobs?, top_logprobs?},
"method": str, "tools": [...]|None, "max_steps": int, "speculative": bool|None}``.

A text completion stores ``"prompts": [text, ...]`` (each encoded as is, no chat template)
instead of ``messages``, and ``sampling.prompt_logprobs`` when it echoes the prompt with
log-probabilities. ``"n": k`` (k > 1) asks for k choices per prompt: :func:`group_from`
gives one engine request per choice, prompt-major (choice ``p * n + j``), choice j seeded
``seed + j``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from core.grammar import Constraint
from core.priorities import rank
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
    prompts = _prompts(stored)
    if not messages and not prompts:
        raise BadJobRequest("the job request has no messages")
    return GenerationRequest(
        messages=list(messages or []), raw_prompt=prompts[0] if prompts else None,
        sampling=sampling_from(stored, default_max_new_tokens),
        method=stored.get("method") or default_method,
        prefix=stored.get("prefix"),
        tools=stored.get("tools"),
        speculative=_flag(stored.get("speculative")),
        constraint=Constraint.from_dict(stored["constraint"]) if stored.get("constraint") else None,
        cache_salt=str(stored.get("cache_scope") or ""),
        priority=rank(stored.get("priority")),
    )


def _flag(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise BadJobRequest("speculative must be true, false or null")


def _prompts(stored: dict[str, Any]) -> list[str]:
    prompts = stored.get("prompts")
    if prompts is None:
        return []
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise BadJobRequest("prompts must be a non-empty list of strings")
    return prompts


def _choices_per_prompt(stored: dict[str, Any]) -> int:
    n = stored.get("n", 1)
    if type(n) is not int or n < 1:
        raise BadJobRequest("n must be a positive integer")
    return n


def group_from(stored: dict[str, Any], default_max_new_tokens: int,
               default_method: str = "official") -> list[GenerationRequest]:
    """One request per choice (see the module doc); a plain job gives a list of one. Only
    the first choice of a prompt scores the prompt (the others' prompt is the same)."""
    base = generation_request_from(stored, default_max_new_tokens, default_method)
    n = _choices_per_prompt(stored)
    out = []
    for prompt in _prompts(stored) or [None]:
        for j in range(n):
            seed = None if base.sampling.seed is None else (base.sampling.seed + j) % 2**63
            sampling = replace(base.sampling, seed=seed,
                               prompt_logprobs=base.sampling.prompt_logprobs if j == 0 else None)
            out.append(replace(base, raw_prompt=prompt, sampling=sampling))
    return out
