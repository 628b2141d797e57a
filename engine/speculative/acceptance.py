"""The speculative acceptance rule, next to the sampler it relies on.

Given the target model's logits for the positions *before* each draft token and after the
last one (``[len(drafts) + 1, vocab]``), choose the tokens to emit: the accepted drafts,
then one more (the correction where a draft was rejected, or a bonus token when all were
accepted). Rows are processed in order and every emitted token is observed by the sampler
before the next row is scored, so the repetition penalty (and any other state the sampler
keeps) sees exactly the context it would see without speculation.

- Greedy: accept while the draft equals the argmax of the processed scores; the first
  mismatch emits the argmax. The emitted tokens are therefore exactly the non-speculative
  greedy tokens.
- Sampling: the draft is deterministic (q is one-hot on draft ``t``), so the standard rule
  (Leviathan et al., Chen et al.) reads: accept ``t`` with probability ``p(t)``; on
  rejection sample from ``(p - q)+`` normalised, i.e. ``p`` with ``t`` removed and
  renormalised. ``p`` is the distribution the sampler would draw from (penalty,
  temperature, top-k, top-p applied), so each emitted token has exactly the
  non-speculative distribution.
"""
from __future__ import annotations

from typing import Sequence

import torch

from engine.sampling import Sampler


def accept_drafts(sampler: Sampler, logits: torch.Tensor, drafts: Sequence[int]) -> list[int]:
    """Tokens to emit for ``drafts`` verified by ``logits [len(drafts) + 1, vocab]``;
    ``len(result) - 1`` drafts were accepted. Every returned token is already observed."""
    if logits.shape[0] < len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} logit rows, got {logits.shape[0]}")
    out: list[int] = []
    for row, draft in enumerate(drafts):
        token, accepted = _judge(sampler, logits[row], int(draft))
        sampler.observe(token)
        out.append(token)
        if not accepted:
            return out
    out.append(sampler(logits[len(drafts)]))   # all accepted: the bonus token
    return out


def _judge(sampler: Sampler, row: torch.Tensor, draft: int) -> tuple[int, bool]:
    scores = sampler.process(row.reshape(-1))
    if sampler.params.greedy:
        token = int(torch.argmax(scores))
        return token, token == draft
    probs = torch.softmax(scores, dim=-1)
    rng = sampler.rng()
    u = float(torch.rand((), generator=rng, device=probs.device))
    if u < float(probs[draft]):
        return draft, True
    residual = probs.clone()
    residual[draft] = 0.0
    total = float(residual.sum())
    if total <= 0.0:          # p(t) == 1 up to rounding: nothing else can be drawn
        return draft, True
    token = int(torch.multinomial(residual / total, 1, generator=rng))
    return token, False
