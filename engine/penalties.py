"""OpenAI's ``presence_penalty``, ``frequency_penalty`` and ``logit_bias``, on top of the
repetition penalty, shared by the hand-written sampler and the ``official`` processor.

OpenAI's definition: ``logits[t] -= presence * (count[t] > 0) + frequency * count[t]``, the
counts over the generated tokens only (not the prompt); then ``logit_bias[t]`` is added
(-100 in practice bans the token). Only the ids that occurred or carry a bias are touched,
so a request without these fields pays nothing.
"""
from __future__ import annotations

from typing import Sequence

import torch

from engine.types import SamplingParams


def check_bias(logit_bias: Sequence[tuple[int, float]], vocab_size: int) -> None:
    """A bias on an id outside the vocabulary is the caller's mistake, not a silent no-op."""
    for token_id, value in logit_bias:
        if not 0 <= int(token_id) < vocab_size:
            raise ValueError(f"logit_bias: token id {token_id} is outside the vocabulary (0..{vocab_size - 1})")
        if not -100.0 <= float(value) <= 100.0:
            raise ValueError(f"logit_bias: {value} for token {token_id} is outside -100..100")


def penalize_counts(scores: torch.Tensor, ids: torch.Tensor, hits: torch.Tensor, presence: float,
                    frequency: float) -> torch.Tensor:
    """OpenAI's two penalties on a float32 ``scores [vocab]`` *in place*: ``ids`` the distinct
    generated ids, ``hits`` (float32) how often each occurred."""
    if ids.numel() and (presence or frequency):
        scores[ids] -= presence + frequency * hits
    return scores


class OpenAIPenalties:
    """Per-request state: generated-token counts and the bias as two small tensors."""

    def __init__(self, params: SamplingParams, vocab_size: int, device: torch.device | str = "cpu") -> None:
        self.presence = float(params.presence_penalty)
        self.frequency = float(params.frequency_penalty)
        check_bias(params.logit_bias, vocab_size)
        self.device = device
        self.counts: dict[int, int] | None = {} if (self.presence or self.frequency) else None
        self.bias_ids: torch.Tensor | None = None
        self.bias_values: torch.Tensor | None = None
        if params.logit_bias:
            self.bias_ids = torch.tensor([int(t) for t, _ in params.logit_bias], dtype=torch.long, device=device)
            self.bias_values = torch.tensor([float(v) for _, v in params.logit_bias], dtype=torch.float32,
                                            device=device)

    @property
    def active(self) -> bool:
        return self.counts is not None or self.bias_ids is not None

    def observe(self, token_id: int) -> None:
        if self.counts is not None:
            self.counts[token_id] = self.counts.get(token_id, 0) + 1

    def apply(self, scores: torch.Tensor) -> torch.Tensor:
        """Penalties then bias, in place on a float32 ``scores [vocab]``."""
        if self.counts:  # a few hundred ids at most: no pass over the vocabulary
            ids = torch.tensor(list(self.counts), dtype=torch.long, device=self.device)
            hits = torch.tensor(list(self.counts.values()), dtype=torch.float32, device=self.device)
            penalize_counts(scores, ids, hits, self.presence, self.frequency)
        if self.bias_ids is not None:
            scores.index_add_(0, self.bias_ids, self.bias_values)
        return scores
