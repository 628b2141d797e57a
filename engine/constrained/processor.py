"""The grammar mask for transformers' ``generate`` (the ``official`` method), as a logits
processor: each call first hands the constraint the token ``generate`` appended since the
last call, then masks the new scores. Batch size 1, as ``official`` runs."""
from __future__ import annotations

import torch
from transformers import LogitsProcessor

from engine.constrained.matcher import TokenConstraint


class GrammarLogitsProcessor(LogitsProcessor):
    def __init__(self, constraint: TokenConstraint, prompt_len: int) -> None:
        self.constraint = constraint
        self.seen = prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for token in input_ids[0, self.seen:].tolist():
            self.constraint.accept(int(token))
        self.seen = input_ids.shape[1]
        return self.constraint.mask(scores[0]).unsqueeze(0)
