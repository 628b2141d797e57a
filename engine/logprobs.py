"""Per-token log-probabilities, computed only when a request asks for them.

What is reported (as vLLM does by default for OpenAI requests): the log-softmax of the
scores after the repetition, presence and frequency penalties and ``logit_bias``, before
the grammar mask and before temperature, top-k and top-p. A token the grammar or
truncation removed still has its log-probability under that distribution.

One entry per sampled token, in order: ``{"token_id", "logprob", "top": [[id, logprob], ...]}``
(plain JSON, so it travels in the job result unchanged).
"""
from __future__ import annotations

from typing import Any

import torch

MAX_TOP_LOGPROBS = 20


class LogprobRecorder:
    """:meth:`score` the distribution before each choice; :meth:`take` the chosen id."""

    def __init__(self, entries: list[dict[str, Any]], top: int) -> None:
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs: must be 0..{MAX_TOP_LOGPROBS}")
        self.entries = entries
        self.top = top
        self._pending: torch.Tensor | None = None

    def score(self, scores: torch.Tensor) -> None:
        self._pending = torch.log_softmax(scores.reshape(-1).to(torch.float32), dim=-1)

    def take(self, token_id: int) -> None:
        logprobs = self._pending
        if logprobs is None:
            return
        self._pending = None
        top: list[list[Any]] = []
        if self.top:
            values, ids = torch.topk(logprobs, self.top)
            top = [[int(i), float(v)] for i, v in zip(ids.tolist(), values.tolist())]
        self.entries.append({"token_id": int(token_id), "logprob": float(logprobs[token_id]), "top": top})
