"""A finished job's choices, as the OpenAI answers read them.

A one-choice job's result holds its text, finish reason and log-probabilities at the top;
a job of several choices (``n`` > 1, or a completion's list of prompts) adds ``choices``
(worker/choices.py), whose entries have the same keys. Either way :func:`result_choices`
gives the list, so a route never asks which kind of job it has.
"""
from __future__ import annotations

from typing import Any

KEYS = ("text", "finish_reason", "logprobs", "prompt_logprobs")


def result_choices(result: dict[str, Any]) -> list[dict[str, Any]]:
    """``[{"index", "prompt_index", "text", "finish_reason", "logprobs", "prompt_logprobs"}]``."""
    if result.get("choices"):
        return list(result["choices"])
    return [{"index": 0, "prompt_index": 0, **{key: result.get(key) for key in KEYS}}]
