"""A job of several choices (``n`` > 1, or a completion's list of prompts): its members run
as one group on the engine loop (:meth:`engine.loop.EngineLoop.submit_group`), and their
results become one job result.

The result keeps a one-choice job's fields (those of choice 0: ``text``, ``finish_reason``,
``logprobs`` ...) so every reader of a job still works, and adds ``choices``: one entry per
choice, in order, ``{"index", "prompt_index", "text", "finish_reason", "logprobs",
"prompt_logprobs", "usage"}``. ``usage`` counts each prompt once: prompt and cached tokens of
the first choice of each prompt (the others share its prompt blocks in ``paged``), the
completion tokens of every choice.
"""
from __future__ import annotations

from typing import Any

from engine.types import GenerationResult

SUMMED = ("completion_tokens", "draft_tokens", "accepted_draft_tokens")
ONCE_PER_PROMPT = ("prompt_tokens", "cached_tokens")


def _usage(results: list[GenerationResult], n: int) -> dict[str, int]:
    usages = [r.usage.__dict__ for r in results]
    out = {key: sum(u[key] for u in usages) for key in SUMMED}
    out.update({key: sum(u[key] for u in usages[::n]) for key in ONCE_PER_PROMPT})
    return out


def _choice(index: int, n: int, result: GenerationResult, leader: GenerationResult) -> dict[str, Any]:
    return {"index": index, "prompt_index": index // n, "text": result.text,
            "finish_reason": result.finish_reason, "logprobs": result.logprobs,
            "prompt_logprobs": leader.prompt_logprobs, "usage": result.usage.__dict__}


def group_result(results: list[GenerationResult], n: int) -> dict[str, Any]:
    """The job result of a group: choice 0's fields, ``choices`` and the group's ``usage``."""
    out = results[0].to_dict()
    out["choices"] = [_choice(i, n, r, results[i - i % n]) for i, r in enumerate(results)]
    out["usage"] = _usage(results, n)
    out["timings"] = {**out["timings"], "total_s": max(r.timings.total_s for r in results)}
    out["finish_reason"] = results[0].finish_reason
    return out
