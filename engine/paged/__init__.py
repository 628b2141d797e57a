"""Paged KV cache: a preallocated block pool, block tables with prefix sharing, and
attention that reads K/V through the block tables.

* :mod:`engine.paged.pool` - the K/V tensors ``[num_blocks, num_layers, block_size,
  kv_heads, head_dim]`` and slot addressing.
* :mod:`engine.paged.block_manager` - free list, per-sequence block tables, chained block
  hashes, reference counts and the LRU of cached blocks.
* :mod:`engine.paged.attention` - per-step batch metadata and the paged attention op.
"""
from engine.paged.block_manager import BlockManager, BlockStats, chain_hash
from engine.paged.pool import KVBlockPool, KVGeometry, KVPoolExhausted, blocks_for_budget

__all__ = ["BlockManager", "BlockStats", "KVBlockPool", "KVGeometry", "KVPoolExhausted",
           "blocks_for_budget", "chain_hash"]
