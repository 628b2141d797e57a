"""Our own KV caches behind the forward's :class:`~engine.forward.AttentionCache` seam.

- :class:`ContiguousKVCache`: one preallocated buffer per request, ``[layers, kv_heads,
  capacity, head_dim]`` for keys and for values; a token's k/v are written once and read by
  every later step. Sized up front (prompt + max new tokens), so decoding allocates nothing
  for the cache; grows by doubling only if a caller under-sizes it.
- :class:`NoCache`: holds nothing; each call attends causally within its own tokens. The
  ``no_cache`` method uses it to recompute the whole sequence for every token.

A cache attends through the forward's small operations (:mod:`engine.ops`): its buffers are
handed to ``ops.cache_attend``, which writes the new keys and values and attends, in torch or
in C, as the forward's weights call for.
"""
from __future__ import annotations

from typing import Any

import torch

from engine.ops.fused_ops import C_MAX_TOKENS
from engine.ops.interface import SmallOps
from engine.ops.torch_ops import EXACT, grouped_attention
from engine.weights import ForwardConfig


class ContiguousKVCache:
    """Keys/values of one sequence in preallocated contiguous buffers."""

    def __init__(self, config: ForwardConfig, capacity: int, dtype: torch.dtype, device: torch.device,
                 ops: SmallOps = EXACT) -> None:
        """``ops``: the forward's small operations, which write and attend (torch's exact ones
        unless told: attention rounded as transformers')."""
        shape = (config.num_layers, config.num_kv_heads, max(1, capacity), config.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0
        self._start = 0
        self.ops = ops

    @property
    def exact(self) -> bool:
        return self.ops.exact

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def _grow(self, needed: int) -> None:
        size = max(needed, 2 * self.capacity)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_empty(old.shape[0], old.shape[1], size, old.shape[3])
            new[:, :, :self.length].copy_(old[:, :, :self.length])
            setattr(self, name, new)

    def begin(self, num_new: int) -> int:
        if self.length + num_new > self.capacity:
            self._grow(self.length + num_new)
        self._start = self.length
        return self._start

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               window: int | None = None) -> torch.Tensor:
        return self.ops.cache_attend(q, k, v, self.k[layer], self.v[layer], self._start, window)

    def commit(self, num_new: int) -> None:
        self.length += num_new

    def takes_decode_step(self, num_new: int) -> bool:
        """Whether a step of ``num_new`` tokens may run as one C call (engine.quant.step): the
        same numbers as :meth:`attend` gives where its ops attend in C."""
        return self.ops.c_attention and num_new <= C_MAX_TOKENS

    def run_decode_step(self, step: Any, x: torch.Tensor, rotary: Any, last_only: bool) -> torch.Tensor:
        """The tokens of embeddings ``x [n, hidden]`` through ``step``: their k/v land at the
        next positions; returns float32 logits of the last (or every) one."""
        n = x.shape[0]
        position = self.begin(n)
        cos, sin = rotary.lookup(position, n)
        logits = step(x, self.k, self.v, self.capacity, None, 0, position, cos, sin, precise=True,
                      head_from=n - 1 if last_only else 0)
        self.commit(n)
        return logits

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (speculative decoding's rejected drafts):
        their slots are simply overwritten by the next tokens, nothing is freed or copied."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {length}")
        self.length = length

    # -- prefix reuse ----------------------------------------------------------------------
    def load(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Copy a stored prefix ``[layers, kv_heads, p, d]`` in (the source is never touched)."""
        length = keys.shape[2]
        if length > self.capacity:
            self._grow(length)
        self.k[:, :, :length].copy_(keys)
        self.v[:, :, :length].copy_(values)
        self.length = length

    def snapshot(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Compact copies of the first ``length`` positions (for the prefix store)."""
        return self.k[:, :, :length].clone(), self.v[:, :, :length].clone()


class NoCache:
    """Attention within the current call only: nothing is kept between calls."""

    def begin(self, num_new: int) -> int:
        return 0

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               window: int | None = None) -> torch.Tensor:
        return grouped_attention(q, k.transpose(0, 1), v.transpose(0, 1), 0, window=window)

    def commit(self, num_new: int) -> None:
        pass
