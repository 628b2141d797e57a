"""A plain batched greedy decode over the hand-written forward, for the quantization benchmark.

Several sequences, each with its own :class:`ContiguousKVCache`, decode together: one
forward call per step carries one token of every sequence, so each projection multiplies
``batch`` rows at once (the case where the packed low-bit kernels lose to bf16 GEMM and
:class:`~engine.quant.QuantizedLinear` switches to the full-precision weight). Attention
stays per sequence. This is the benchmark's stand-in where no batching scheduler is merged;
its decode steps run as the scheduler's decode-only steps do (``q8.batched_decode``).
"""
from __future__ import annotations

import time

import torch

from engine.forward import Qwen2Forward
from engine.kv_cache import ContiguousKVCache
from engine.quant import q8


class BatchDecodeCache:
    """``AttentionCache`` over one contiguous cache per sequence, one new token each."""

    def __init__(self, caches: list[ContiguousKVCache]) -> None:
        self.caches = caches

    def begin(self, num_new: int) -> torch.Tensor:
        if num_new != len(self.caches):
            raise ValueError("a batched decode step carries exactly one token per sequence")
        return torch.tensor([cache.begin(1) for cache in self.caches], dtype=torch.long)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([cache.attend(layer, q[i:i + 1], k[i:i + 1], v[i:i + 1])
                          for i, cache in enumerate(self.caches)])

    def commit(self, num_new: int) -> None:
        for cache in self.caches:
            cache.commit(1)


def batched_greedy(forward: Qwen2Forward, prompts: list[list[int]], steps: int) -> dict:
    """Prefill each prompt alone, then ``steps`` batched greedy steps: decode tokens/s and
    each sequence's tokens (first one from its prefill)."""
    weights = forward.weights
    with torch.inference_mode():
        caches, first = [], []
        for ids in prompts:
            cache = ContiguousKVCache(forward.config, len(ids) + steps + 1, weights.dtype, weights.device)
            logits = forward(torch.tensor(ids, dtype=torch.long), cache)
            caches.append(cache)
            first.append(int(logits[-1].argmax()))
        batch = BatchDecodeCache(caches)
        tokens = torch.tensor(first, dtype=torch.long)
        produced = [tokens]
        started = time.perf_counter()
        for _ in range(steps):
            with q8.batched_decode():  # as the paged scheduler runs a decode-only step
                logits = forward(tokens, batch, last_only=False)
            tokens = logits.argmax(dim=-1)
            produced.append(tokens)
        elapsed = time.perf_counter() - started
    return {"batch": len(prompts), "steps": steps, "decode_tps": len(prompts) * steps / elapsed,
            "tokens": torch.stack(produced, dim=1).tolist()}
