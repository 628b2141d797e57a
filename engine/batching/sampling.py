"""Next-token choice for one sequence of a batch, with that sequence's own parameters.

Mirrors what transformers' ``generate`` does for one sequence, in the same order:
repetition penalty over every id seen so far (prompt and output), then for sampling
temperature, top-k, top-p and a draw from the sequence's own ``torch.Generator`` (so a
seeded request gives the same text whether it runs alone or in a batch).
"""
from __future__ import annotations

import torch

from engine.types import SamplingParams


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """HF's rule: a seen token's logit is divided by ``penalty`` if positive, else multiplied."""
    if penalty == 1.0 or seen.numel() == 0:
        return logits
    picked = logits.gather(0, seen)
    picked = torch.where(picked < 0, picked * penalty, picked / penalty)
    return logits.scatter(0, seen, picked)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) everything outside the top ``top_k`` and the ``top_p`` nucleus."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove = cumulative <= (1 - top_p)
        remove[-1] = False  # always keep the most likely token
        logits = logits.masked_fill(remove.scatter(0, order, remove), float("-inf"))
    return logits


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A private generator for a sampled request (seeded when the request gives a seed)."""
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    if params.seed is not None:
        generator.manual_seed(params.seed)
    else:
        generator.seed()
    return generator


def next_token(logits: torch.Tensor, seen: torch.Tensor, params: SamplingParams, penalty: float,
               generator: torch.Generator | None) -> int:
    """Pick the next id from one row of float32 logits ``[vocab]``."""
    logits = apply_repetition_penalty(logits, seen, penalty)
    if params.greedy:
        return int(torch.argmax(logits))
    logits = filter_top_k_top_p(logits / params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(logits, -1)
    return int(torch.multinomial(probs, 1, generator=generator))
