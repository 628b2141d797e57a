"""The physical KV block pool: one preallocated K tensor and one V tensor per worker.

Shapes follow the original MiniServe prototype, ``[num_blocks, num_layers, block_size,
num_kv_heads, head_dim]``: a block holds ``block_size`` consecutive token positions of one
sequence for every layer, so one block id (from a block table) names a sequence's K/V in all
layers at once.  A *slot* is ``block_id * block_size + offset``; the forward writes new K/V
into slots and reads a sequence's history with one gather over its block table.

This module holds tensors only; which block belongs to whom is :mod:`engine.paged.block_manager`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


class KVPoolExhausted(RuntimeError):
    """The pool has no free or evictable block left for a request; nothing was changed."""


@dataclass(frozen=True)
class KVGeometry:
    """What one token's K/V looks like for a model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """K plus V for every layer of one token."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


def blocks_for_budget(budget_bytes: int, block_size: int, geometry: KVGeometry,
                      dtype: torch.dtype) -> int:
    """How many blocks fit in ``budget_bytes`` (at least one)."""
    per_block = block_size * geometry.bytes_per_token(dtype)
    return max(1, budget_bytes // per_block)


class KVBlockPool:
    """Preallocated K/V storage addressed by block id and slot."""

    def __init__(self, num_blocks: int, block_size: int, geometry: KVGeometry,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.geometry = geometry
        shape = (num_blocks, geometry.num_layers, block_size, geometry.num_kv_heads,
                 geometry.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def _split(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return slots // self.block_size, slots % self.block_size

    def write_layer(self, layer: int, slots: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, split: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Store one layer's new K/V (``[n, kv_heads, head_dim]``) into ``slots`` (``[n]``);
        ``split`` is ``(slots // block_size, slots % block_size)`` when the caller has it."""
        blocks, offsets = split if split is not None else self._split(slots)
        self.k[blocks, layer, offsets] = k.to(self.k.dtype)
        self.v[blocks, layer, offsets] = v.to(self.v.dtype)

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store all layers at once: ``k``/``v`` are ``[num_layers, n, kv_heads, head_dim]``."""
        blocks, offsets = self._split(slots)
        self.k[blocks, :, offsets] = k.transpose(0, 1).to(self.k.dtype)
        self.v[blocks, :, offsets] = v.transpose(0, 1).to(self.v.dtype)

    def write_slot(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one token's K/V for all layers (``[num_layers, kv_heads, head_dim]``)."""
        block, offset = divmod(slot, self.block_size)
        self.k[block, :, offset] = k
        self.v[block, :, offset] = v

    def gather_layer(self, layer: int, block_tables: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """One vectorised gather: ``block_tables`` ``[batch, max_blocks]`` ->
        K and V ``[batch, max_blocks * block_size, kv_heads, head_dim]``."""
        batch, max_blocks = block_tables.shape
        k = self.k[block_tables, layer]
        v = self.v[block_tables, layer]
        shape = (batch, max_blocks * self.block_size, self.geometry.num_kv_heads,
                 self.geometry.head_dim)
        return k.reshape(shape), v.reshape(shape)

    def read(self, block_table: list[int], num_tokens: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """A sequence's K/V as ``[num_layers, num_tokens, kv_heads, head_dim]`` (tests, tools)."""
        index = torch.tensor(block_table, dtype=torch.long, device=self.device)
        g = self.geometry
        k = self.k[index].transpose(0, 1).reshape(g.num_layers, -1, g.num_kv_heads, g.head_dim)
        v = self.v[index].transpose(0, 1).reshape(g.num_layers, -1, g.num_kv_heads, g.head_dim)
        return k[:, :num_tokens], v[:, :num_tokens]
