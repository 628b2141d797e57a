"""Block pool and block tables: boundaries, K/V round trips, free/reuse, stats, exhaustion.

Without prefix sharing (tests/paged/test_prefix_sharing.py has it)."""
import pytest
import torch

from engine.paged import BlockManager, KVBlockPool, KVGeometry, KVPoolExhausted, blocks_for_budget
from tests.paged.kv import Paged

GEOM = KVGeometry(num_layers=3, num_kv_heads=2, head_dim=4)
BS = 4


def kv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (GEOM.num_layers, n, GEOM.num_kv_heads, GEOM.head_dim)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def make(num_blocks: int = 16) -> Paged:
    return Paged(KVBlockPool(num_blocks, BS, GEOM), sharing=False)


@pytest.mark.parametrize("n,blocks", [(1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_prefill_takes_ceil_blocks(n, blocks):
    cache = make()
    k, v = kv(n, 0)
    cache.create("s", list(range(n)), k, v)
    assert len(cache.blocks.block_table("s")) == blocks
    assert cache.stats().blocks_used == blocks


def test_token_append_allocates_only_when_last_block_full():
    cache = make()
    k, v = kv(3, 0)
    cache.create("s", [1, 2, 3], k, v)
    sizes = []
    for i in range(10):
        tk, tv = kv(1, 10 + i)
        cache.append("s", [100 + i], tk, tv)
        sizes.append(len(cache.blocks.block_table("s")))
    # lengths 4..13 -> blocks 1,2,2,2,2,3,3,3,3,4
    assert sizes == [1, 2, 2, 2, 2, 3, 3, 3, 3, 4]


def test_round_trip_prefill_and_token_append_element_wise():
    cache = make()
    k0, v0 = kv(6, 1)
    cache.create("a", list(range(6)), k0, v0)
    ks, vs = [k0], [v0]
    for i in range(7):                      # crosses two block boundaries
        tk, tv = kv(1, 20 + i)
        cache.append("a", [50 + i], tk, tv)
        ks.append(tk)
        vs.append(tv)
    k, v = cache.read("a")
    assert torch.equal(k, torch.cat(ks, 1))
    assert torch.equal(v, torch.cat(vs, 1))


def test_interleaved_sequences_do_not_touch_each_other():
    cache = make()
    ka, va = kv(5, 2)
    kb, vb = kv(7, 3)
    cache.create("a", list(range(5)), ka, va)
    cache.create("b", list(range(100, 107)), kb, vb)
    tk, tv = kv(1, 4)
    cache.append("a", [9], tk, tv)
    k, v = cache.read("b")
    assert torch.equal(k, kb) and torch.equal(v, vb)
    k, _ = cache.read("a")
    assert torch.equal(k, torch.cat([ka, tk], 1))
    assert not set(cache.blocks.block_table("a")) & set(cache.blocks.block_table("b"))


def test_free_returns_blocks_and_they_are_reused():
    cache = make(num_blocks=4)
    k, v = kv(16, 6)
    cache.create("a", list(range(16)), k, v)
    table = cache.blocks.block_table("a")
    assert cache.stats().blocks_free == 0
    cache.blocks.free("a")
    assert cache.stats().blocks_used == 0 and cache.stats().blocks_free == 4
    k2, v2 = kv(16, 7)
    cache.create("b", list(range(16)), k2, v2)
    assert sorted(cache.blocks.block_table("b")) == sorted(table)
    assert torch.equal(cache.read("b")[0], k2)


def test_fragmentation_and_token_figures():
    cache = make()
    for name, n in (("a", 5), ("b", 8), ("c", 1)):
        k, v = kv(n, n)
        cache.create(name, list(range(n)), k, v)
    stats = cache.stats()
    assert stats.blocks_used == 2 + 2 + 1
    assert stats.logical_tokens == 14 and stats.tokens_stored == 14
    assert stats.empty_slots == 3 + 0 + 3
    assert stats.fragmentation == pytest.approx(6 / 20)
    assert stats.peak_blocks_used == 5
    cache.blocks.free("b")
    assert cache.stats().peak_blocks_used == 5 and cache.stats().blocks_used == 3


def test_exhaustion_raises_without_touching_others():
    cache = make(num_blocks=3)
    k, v = kv(8, 8)
    cache.create("a", list(range(8)), k, v)
    with pytest.raises(KVPoolExhausted):
        cache.create("b", list(range(100, 109)), *kv(9, 9))   # needs 3 blocks, 1 left
    assert "b" not in cache.blocks
    assert cache.stats().blocks_used == 2 and cache.stats().blocks_free == 1
    assert torch.equal(cache.read("a")[0], k)
    cache.create("c", [1, 2, 3, 4], *kv(4, 10))                # the last block still works
    with pytest.raises(KVPoolExhausted):
        cache.append("c", [5], *kv(1, 11))
    assert cache.blocks.num_tokens("c") == 4
    assert torch.equal(cache.read("a")[0], k)


def test_pool_sized_from_memory_budget():
    per_block = BS * GEOM.bytes_per_token(torch.float32)
    assert GEOM.bytes_per_token(torch.float32) == 2 * 3 * 2 * 4 * 4
    assert blocks_for_budget(10 * per_block + 5, BS, GEOM, torch.float32) == 10
    pool = KVBlockPool(blocks_for_budget(7 * per_block, BS, GEOM, torch.float32), BS, GEOM)
    assert pool.num_blocks == 7 and pool.nbytes == 7 * per_block


def test_manager_rejects_double_allocation_and_empty_sequences():
    manager = BlockManager(4, BS)
    manager.allocate("a", [1])
    with pytest.raises(ValueError):
        manager.allocate("a", [1])
    with pytest.raises(ValueError):
        manager.allocate("b", [])
