"""Greedy agreement of a quantized forward with the unquantized one (quantization benchmark).

Two views, both on single-token decode steps (the path the packed kernels serve):
- free-running: each setting generates on its own; the share of positions whose token equals
  the reference's (one early difference sends the rest of a text elsewhere, so this is harsh);
- teacher-forced: the reference tokens are fed back and, at every position, the quantized
  model's top-1 next token is compared with the reference's (no cascade: per-token fidelity).
"""
from __future__ import annotations

import torch

from engine.forward import Qwen2Forward
from engine.kv_cache import ContiguousKVCache


def free_running(reference: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    """Position-wise agreement over the reference's tokens, identical texts, first difference."""
    same = total = identical = 0
    first_diffs = []
    for ref, got in zip(reference, other):
        total += len(ref)
        matches = [a == b for a, b in zip(ref, got)]
        same += sum(matches)
        identical += int(ref == got)
        first_diffs.append(matches.index(False) if False in matches else len(ref))
    return {"agree_free": same / max(total, 1), "identical": identical,
            "first_diff_mean": sum(first_diffs) / max(len(first_diffs), 1)}


def teacher_forced(forward: Qwen2Forward, prompts: list[list[int]], reference: list[list[int]]) -> float:
    """Share of reference positions where ``forward``'s greedy token equals the reference."""
    same = total = 0
    weights = forward.weights
    with torch.inference_mode():
        for ids, ref in zip(prompts, reference):
            # the cache a worker's custom_cache builds for these weights (engine.handwritten)
            cache = ContiguousKVCache(forward.config, len(ids) + len(ref) + 1, weights.dtype, weights.device,
                                      ops=forward.ops)
            logits = forward(torch.tensor(ids, dtype=torch.long), cache)
            token = torch.empty(1, dtype=torch.long)
            for expected in ref:
                same += int(int(logits[-1].argmax()) == expected)
                total += 1
                token.fill_(expected)
                logits = forward(token, cache)
    return same / max(total, 1)
