"""Our own KV caches behind the forward's :class:`~engine.forward.AttentionCache` seam.

- :class:`ContiguousKVCache`: one preallocated buffer per request, ``[layers, kv_heads,
  capacity, head_dim]`` for keys and for values; a token's k/v are written once and read by
  every later step. Sized up front (prompt + max new tokens), so decoding allocates nothing
  for the cache; grows by doubling only if a caller under-sizes it.
- :class:`NoCache`: holds nothing; each call attends causally within its own tokens. The
  ``no_cache`` method uses it to recompute the whole sequence for every token.

:func:`grouped_attention` is the attention both use (and the paged cache can reuse): query
heads that share a kv head read it directly (SDPA ``enable_gqa``), so keys and values are never repeated.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.fused import attend_decode, attend_rows
from engine.weights import ForwardConfig


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                      exact: bool = True, window: int | None = None) -> torch.Tensor:
    """Attention of ``q [n, heads, d]`` at positions ``start..start+n-1`` over ``keys/values
    [kv_heads, start+n, d]`` (causal). Returns ``[n, heads * d]``.

    SDPA's ``enable_gqa`` shares each kv head with its query group without repeating keys,
    and is the exact call transformers makes (same kernel, same rounding), so greedy tokens
    match ``generate`` bit for bit. ``exact=False`` (quantized weights, which promise no such
    equality) runs a one-token decode step with the query group folded into the query axis,
    as the paged decode does: it rounds differently in bf16, but SDPA's ``enable_gqa`` path
    for one query grows with the context, ~10x the folded call by 1,000 tokens
    (``python -m bench.decode_attention``, results/decode_attention.json).
    """
    n, heads, dim = q.shape
    if window is not None and start + n > window:
        return _windowed_attention(q, keys, values, start, window)
    if n == 1 and not exact:
        kv_heads = keys.shape[0]
        folded = q.view(1, kv_heads, heads // kv_heads, dim)   # [1, kv_heads, group, d]
        out = F.scaled_dot_product_attention(folded, keys.unsqueeze(0), values.unsqueeze(0))
        return out.reshape(1, heads * dim)
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
    total = keys.shape[1]
    mask = None
    if n > 1 and not (start == 0 and total == n):
        key_pos = torch.arange(total, device=q.device)
        query_pos = torch.arange(start, start + n, device=q.device)
        mask = key_pos[None, :] <= query_pos[:, None]
    out = F.scaled_dot_product_attention(qh, keys.unsqueeze(0), values.unsqueeze(0), attn_mask=mask,
                                         is_causal=n > 1 and mask is None, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(n, heads * dim)


def _windowed_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                        window: int) -> torch.Tensor:
    """:func:`grouped_attention` where each query at position ``p`` sees keys ``p - window + 1
    .. p`` only (Mistral's sliding window, transformers' mask), once the context exceeds it."""
    n, heads, dim = q.shape
    key_pos = torch.arange(keys.shape[1], device=q.device)
    query_pos = torch.arange(start, start + n, device=q.device)[:, None]
    mask = (key_pos[None, :] <= query_pos) & (key_pos[None, :] > query_pos - window)
    out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
                                         attn_mask=mask, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(n, heads * dim)


# Steps of at most this many tokens attend in C in a fused cache (as the paged cache's verify
# steps and short chunks do, engine.paged.attention); longer prefills keep torch's SDPA.
FUSED_MAX_TOKENS = 16


class ContiguousKVCache:
    """Keys/values of one sequence in preallocated contiguous buffers."""

    def __init__(self, config: ForwardConfig, capacity: int, dtype: torch.dtype, device: torch.device,
                 exact: bool = True, fused: bool = False) -> None:
        """``exact``: attention rounded as transformers' (see :func:`grouped_attention`);
        ``fused`` (a low-bit bf16 forward on CPU, :mod:`engine.fused`): a one-token step writes
        its k/v and attends in one C call."""
        shape = (config.num_layers, config.num_kv_heads, max(1, capacity), config.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0
        self._start = 0
        self.exact = exact
        self.fused = fused and not exact

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
        end = self._start + q.shape[0]
        if self.fused and (window is None or end <= window):   # the C calls attend over everything
            if q.shape[0] == 1:
                return attend_decode(q, k, v, self.k[layer], self.v[layer], self._start)
            if q.shape[0] <= FUSED_MAX_TOKENS:   # a verify step, a short chunk
                return attend_rows(q, k, v, self.k[layer], self.v[layer], self._start)
        self.k[layer, :, self._start:end].copy_(k.transpose(0, 1))
        self.v[layer, :, self._start:end].copy_(v.transpose(0, 1))
        return grouped_attention(q, self.k[layer, :, :end], self.v[layer, :, :end], self._start, self.exact, window)

    def commit(self, num_new: int) -> None:
        self.length += num_new

    def takes_decode_step(self, num_new: int) -> bool:
        """Whether a step of ``num_new`` tokens may run as one C call (engine.quant.step): the
        same numbers as :meth:`attend`'s fused paths, which only a fused cache takes."""
        return self.fused and num_new <= FUSED_MAX_TOKENS

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
