"""The paged KV cache as one object: a :class:`KVBlockPool` plus a :class:`BlockManager`.

The generation path uses the two parts directly (the forward writes through
:func:`engine.paged.attention.paged_attention`); this facade gives the sequence-level
operations of the original prototype (create, append a prefill, append a token, read,
attend, free) for tests, benchmarks and tools.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import torch

from engine.paged.attention import SeqChunk, build_batch, paged_attention
from engine.paged.block_manager import BlockManager, BlockStats
from engine.paged.pool import KVBlockPool, KVGeometry, blocks_for_budget


class PagedKVCache:
    """Sequences' K/V in a shared pool of fixed-size blocks."""

    def __init__(self, num_blocks: int, block_size: int, geometry: KVGeometry,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 prefix_sharing: bool = True):
        self.pool = KVBlockPool(num_blocks, block_size, geometry, dtype, device)
        self.blocks = BlockManager(num_blocks, block_size, prefix_sharing=prefix_sharing)

    @classmethod
    def from_budget(cls, budget_bytes: int, block_size: int, geometry: KVGeometry,
                    dtype: torch.dtype = torch.float32, **kwargs) -> "PagedKVCache":
        """Size the pool to a memory budget instead of a block count."""
        return cls(blocks_for_budget(budget_bytes, block_size, geometry, dtype), block_size,
                   geometry, dtype, **kwargs)

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    def _slots(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.as_tensor(slots, dtype=torch.long, device=self.pool.device)

    def create(self, seq_id: Hashable, token_ids: Sequence[int], k: torch.Tensor,
               v: torch.Tensor) -> int:
        """Add a sequence with its prefill K/V (``[num_layers, n, kv_heads, dim]``).
        Returns the number of leading tokens found cached (their K/V is not rewritten)."""
        cached = self.blocks.allocate(seq_id, token_ids)
        slots = self.blocks.slots(seq_id, cached, len(token_ids))
        self.pool.write(self._slots(slots), k[:, cached:], v[:, cached:])
        self.blocks.commit(seq_id)
        return cached

    def append(self, seq_id: Hashable, token_ids: Sequence[int], k: torch.Tensor,
               v: torch.Tensor) -> None:
        """Append tokens (usually one) with their K/V ``[num_layers, n, kv_heads, dim]``."""
        slots = self.blocks.append(seq_id, token_ids)
        if len(slots) == 1:
            self.pool.write_slot(slots[0], k[:, 0], v[:, 0])
        else:
            self.pool.write(self._slots(slots), k, v)
        self.blocks.commit(seq_id)

    def read(self, seq_id: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K/V as ``[num_layers, n, kv_heads, dim]`` (a copy)."""
        return self.pool.read(self.blocks.block_table(seq_id), self.blocks.num_tokens(seq_id))

    def attend(self, seq_id: Hashable, q: torch.Tensor) -> torch.Tensor:
        """Attention of one query per layer (``q``: ``[num_layers, heads, dim]``, the
        sequence's last position) over its stored K/V, read in place through the block
        table: the index metadata is built once, then one gather per layer."""
        n = self.blocks.num_tokens(seq_id)
        batch = build_batch([SeqChunk(self.blocks.block_table(seq_id), n - 1, 1)],
                            self.block_size, self.pool.device)
        out = []
        for layer in range(q.shape[0]):
            keys, values = self.pool.gather_layer(layer, batch.block_tables)
            keys, values = keys[:, :n], values[:, :n]      # one sequence: cut, no mask
            out.append(torch.nn.functional.scaled_dot_product_attention(
                q[layer][None, :, None], keys.transpose(1, 2), values.transpose(1, 2),
                enable_gqa=keys.shape[2] != q.shape[1])[0, :, 0])
        return torch.stack(out)

    def free(self, seq_id: Hashable) -> None:
        self.blocks.free(seq_id)

    def stats(self) -> BlockStats:
        return self.blocks.stats()


__all__ = ["PagedKVCache", "paged_attention"]
