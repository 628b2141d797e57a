"""Log-probabilities of a prompt's own tokens (``echo`` with ``logprobs`` on ``/v1/completions``).

Each prompt token after the first is scored under the model's distribution given the tokens
before it: the raw log-softmax of the logits (no penalty, bias or temperature applies to a
prompt), as vLLM's ``prompt_logprobs`` reports them. The first token has nothing before it,
so its logprob is ``None``.

One forward over the whole prompt with no cache (generation's caches are not touched, and a
prefix hit cannot skip the positions that need scores), on the loop thread, before the
request's own prefill: as long as one prefill. The vocabulary-sized rows are made a few at a
time, so a long prompt never holds ``tokens x vocab`` floats at once.
"""
from __future__ import annotations

from typing import Any

import torch

from engine.forward import Qwen2Forward
from engine.kv_cache import NoCache
from engine.logprobs import MAX_TOP_LOGPROBS

ROWS_PER_CHUNK = 32


def _entries(logprobs: torch.Tensor, next_ids: list[int], top: int) -> list[dict[str, Any]]:
    chosen = logprobs.gather(1, torch.tensor(next_ids, device=logprobs.device).unsqueeze(1)).squeeze(1)
    tops: list[list[list[Any]]] = [[] for _ in next_ids]
    if top:
        values, ids = torch.topk(logprobs, top, dim=-1)
        tops = [[[int(i), float(v)] for i, v in zip(row_ids, row_values)]
                for row_ids, row_values in zip(ids.tolist(), values.tolist())]
    return [{"token_id": int(t), "logprob": float(lp), "top": alt}
            for t, lp, alt in zip(next_ids, chosen.tolist(), tops)]


def score_prompt(forward: Qwen2Forward, ids: list[int], top: int) -> list[dict[str, Any]]:
    """``[{"token_id", "logprob", "top": [[id, logprob], ...]}]``, one per prompt token."""
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs: must be 0..{MAX_TOP_LOGPROBS}")
    out: list[dict[str, Any]] = [{"token_id": int(ids[0]), "logprob": None, "top": []}]
    if len(ids) < 2:
        return out
    device = forward.weights.device
    with torch.inference_mode():
        hidden = forward.hidden(torch.tensor(ids[:-1], dtype=torch.long, device=device), NoCache())
        for start in range(0, hidden.shape[0], ROWS_PER_CHUNK):
            rows = forward.logits(hidden[start:start + ROWS_PER_CHUNK])
            logprobs = torch.log_softmax(rows.float(), dim=-1)
            out.extend(_entries(logprobs, ids[start + 1:start + 1 + rows.shape[0]], top))
    return out
