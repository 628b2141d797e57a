"""The interface of the forward's small operations (:mod:`engine.ops`).

Why one interface: the same operations existed as torch calls, as C calls and inside the
one-call step, and every caller chose among them with an ``if`` of its own. Now the forward
holds one :class:`SmallOps` (chosen once, :func:`engine.ops.choose.small_ops_for`) and the
caches it drives receive the same object; none of them asks which implementation it is.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch


class SmallOps(Protocol):
    """What a forward and its caches call between the linears. Tensors are bf16 or float32 rows
    ``[n, ...]`` of the flattened tokens (``engine.forward``)."""

    exact: bool
    """Attention rounded as transformers' (full-precision weights promise ``official``'s tokens)."""
    c_attention: bool
    """The cache attention runs in C: the whole-step kernel (engine.quant.step) computes the
    same numbers, so it may stand in for a step of these operations."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of the rows of ``x [n, dim]``, then ``weight``."""
        ...

    def rotary(self, qkv: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
        """The first ``heads`` heads of each row of ``qkv`` (q and k side by side) rotated, as
        ``[n, heads, head_dim]`` (rotated in place where the implementation can: use the result);
        ``cos``, ``sin``: ``[n, 1, head_dim]``."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of ``[n, 2 * inter]`` holding [gate | up] per row."""
        ...

    def cache_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                     values: torch.Tensor, start: int, window: int | None = None) -> torch.Tensor:
        """Write ``k, v [n, kv_heads, d]`` at positions ``start..`` of one layer's contiguous
        ``keys/values [kv_heads, capacity, d]``, then attend ``q [n, heads, d]`` causally over
        positions ``0..start+n-1`` (the last ``window`` only, for a sliding-window layer).
        Returns ``[n, heads * d]``."""
        ...

    def paged_gather(self, pool: Any, layer: int, batch: Any, k: torch.Tensor, v: torch.Tensor, length: int,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a paged step's new ``k, v [n, kv_heads, d]`` at ``batch.slot_mapping`` of one
        layer, then return positions ``0..length-1`` of each of ``batch.block_tables``' keys and
        values as ``[batch, kv_heads, length, d]`` in ``dtype``, for torch's attention."""
        ...

    def paged_attend(self, pool: Any, layer: int, batch: Any, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor) -> torch.Tensor | None:
        """A paged step of few queries per sequence (decodes, verify steps, short chunks) written
        and attended reading the blocks where they lie, ``[n, heads, d]``; None where this
        implementation has no such kernel (the caller gathers, then attends with torch)."""
        ...
