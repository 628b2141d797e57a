"""The small operations as one C call each (:mod:`engine.ops.c_calls`), for a low-bit bf16
forward on CPU.

- :class:`FusedOps`: RMSNorm, rotary (in place in the qkv output), silu * up, and a paged
  step's write + gather in C; the attention itself stays torch's (folded for one token).
  Where torch runs AVX2 kernels the C attention did not keep q8's agreement with bf16, so
  these are the ops there.
- :class:`CAttentionOps`: the same, and the attention of steps of up to :data:`C_MAX_TOKENS`
  tokens of a sequence (decodes, verify steps, short chunks) in C too: a contiguous cache's
  write + attention in one call, a paged step's read through the block tables where they lie.

Anything the C calls do not cover (float32 tensors, longer prefills, a sliding window that
the context has passed) falls through to :class:`~engine.ops.torch_ops.TorchOps`.
"""
from __future__ import annotations

from typing import Any

import torch

from engine.ops import c_calls
from engine.ops.torch_ops import TorchOps

BF16 = torch.bfloat16
# Steps of at most this many tokens of a sequence attend in C; longer prefills keep torch's SDPA
# (the one-call step, engine.quant.step, takes the same steps).
C_MAX_TOKENS = 16


class FusedOps(TorchOps):
    """Norms, rotary, silu * up and the paged gather in C; torch's (folded) attention."""

    def __init__(self) -> None:
        super().__init__(exact=False)   # low-bit weights: no token equality with official to keep

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return c_calls.rms_norm(x, weight, eps)

    def rotary(self, qkv: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
        c_calls.rotary_(qkv, heads, head_dim, cos, sin)
        return qkv[:, :heads * head_dim].view(qkv.shape[0], heads, head_dim)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return c_calls.silu_mul(gate_up)

    def paged_gather(self, pool: Any, layer: int, batch: Any, k: torch.Tensor, v: torch.Tensor, length: int,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The values torch's indexing, gather and transpose produce, in one C call (those ops
        cost ~60 us per layer of a decode step)."""
        if not (dtype == pool.dtype == BF16 and pool.device.type == "cpu"):
            return super().paged_gather(pool, layer, batch, k, v, length, dtype)
        return c_calls.paged_gather(pool, layer, batch.block_tables, batch.slot_mapping, k, v, length)


class CAttentionOps(FusedOps):
    """:class:`FusedOps` whose attention of a few tokens per sequence runs in C as well."""

    c_attention = True

    def cache_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                     values: torch.Tensor, start: int, window: int | None = None) -> torch.Tensor:
        n = q.shape[0]
        if n > C_MAX_TOKENS or (window is not None and start + n > window):   # C attends over everything
            return super().cache_attend(q, k, v, keys, values, start, window)
        if n == 1:
            return c_calls.attend_decode(q, k, v, keys, values, start)
        return c_calls.attend_rows(q, k, v, keys, values, start)    # a verify step, a short chunk

    def paged_attend(self, pool: Any, layer: int, batch: Any, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor) -> torch.Tensor | None:
        """A decode-only step's k/v are written by the C call itself; otherwise first by torch."""
        queries = batch.q_index.shape[1]   # per sequence, padded to the longest
        if queries > C_MAX_TOKENS or not q.dtype == pool.dtype == BF16:
            return None
        decode_only = queries == 1
        if not decode_only:
            pool.write_layer(layer, batch.slot_mapping, k, v, batch.slot_split)
        return c_calls.paged_attend(pool, layer, batch.block_tables, batch.token_rows, batch.positions, q, k, v,
                                    write=decode_only)
