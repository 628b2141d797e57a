"""torch's small operations: the exact reference, and what the fused ones fall back to.

Numerics follow transformers' Qwen2 so greedy outputs match ``generate`` token for token:
RMSNorm in float32, rotary with transformers' ``rotate_half``, ``F.silu``, and attention
through the same SDPA call transformers makes (``enable_gqa``: each kv head is shared by its
query group without repeating keys). Every forward over full-precision weights (``none``, any
dtype or device) runs these; a low-bit forward without the native library does too, with
the folded one-token attention (``exact=False``, :func:`grouped_attention`).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return (x * cos) + (_rotate_half(x) * sin)


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                      exact: bool = True, window: int | None = None) -> torch.Tensor:
    """Attention of ``q [n, heads, d]`` at positions ``start..start+n-1`` over ``keys/values
    [kv_heads, start+n, d]`` (causal). Returns ``[n, heads * d]``.

    SDPA's ``enable_gqa`` shares each kv head with its query group without repeating keys,
    and is the exact call transformers makes (same kernel, same rounding), so greedy tokens
    match ``generate`` bit for bit. ``exact=False`` (quantized weights, which promise no such
    equality) runs a one-token decode step with the query group folded into the query axis,
    as the paged decode does: it rounds differently in bf16, but SDPA's ``enable_gqa`` path
    for one query grows with the context, ~10x the folded call by 1,000 tokens.
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


class TorchOps:
    """:class:`~engine.ops.interface.SmallOps` in torch. ``exact``: a one-token step attends
    with transformers' own call (full-precision weights) rather than the folded one."""

    c_attention = False

    def __init__(self, exact: bool = True) -> None:
        self.exact = exact

    def __repr__(self) -> str:
        return f"{type(self).__name__}(exact={self.exact})"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def rotary(self, qkv: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
        return apply_rotary(qkv[:, :heads * head_dim].view(qkv.shape[0], heads, head_dim), cos, sin)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    def cache_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                     values: torch.Tensor, start: int, window: int | None = None) -> torch.Tensor:
        end = start + q.shape[0]
        keys[:, start:end].copy_(k.transpose(0, 1))
        values[:, start:end].copy_(v.transpose(0, 1))
        return grouped_attention(q, keys[:, :end], values[:, :end], start, self.exact, window)

    def paged_gather(self, pool: Any, layer: int, batch: Any, k: torch.Tensor, v: torch.Tensor, length: int,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        pool.write_layer(layer, batch.slot_mapping, k, v, batch.slot_split)
        keys, values = pool.gather_layer(layer, batch.block_tables)    # [B, T, Hkv, D]
        keys, values = keys[:, :length], values[:, :length]
        return keys.transpose(1, 2).to(dtype), values.transpose(1, 2).to(dtype)

    def paged_attend(self, pool: Any, layer: int, batch: Any, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor) -> torch.Tensor | None:
        return None


EXACT = TorchOps(exact=True)   # the reference, and the caches' default
