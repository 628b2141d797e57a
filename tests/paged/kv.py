"""The paged pool and its block tables driven as the batching scheduler drives them (allocate,
write the new tokens' K/V to their slots, commit), for tests of the two parts together."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.paged import BlockManager, KVBlockPool


@dataclass
class Paged:
    """A pool and its block tables, written through as the service writes them."""

    pool: KVBlockPool
    sharing: bool = True
    blocks: BlockManager = field(init=False)

    def __post_init__(self) -> None:
        self.blocks = BlockManager(self.pool.num_blocks, self.pool.block_size, prefix_sharing=self.sharing)

    def create(self, seq, ids, k, v) -> int:
        cached = self.blocks.allocate(seq, ids)
        self.pool.write(torch.tensor(self.blocks.slots(seq, cached, len(ids))), k[:, cached:], v[:, cached:])
        self.blocks.commit(seq)
        return cached

    def append(self, seq, ids, k, v) -> None:
        self.pool.write(torch.tensor(self.blocks.append(seq, ids)), k, v)
        self.blocks.commit(seq)

    def read(self, seq) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool.read(self.blocks.block_table(seq), self.blocks.num_tokens(seq))

    def stats(self):
        return self.blocks.stats()
