"""Prefix sharing at block granularity: chained hashes, refcounts, LRU eviction, collisions."""
import torch

from engine.paged import BlockManager, KVBlockPool, KVGeometry
from tests.paged.kv import Paged

BS = 4


def manager(num_blocks: int = 32, **kwargs) -> BlockManager:
    return BlockManager(num_blocks, BS, **kwargs)


def run(m: BlockManager, seq_id, tokens) -> int:
    """Allocate and mark the K/V as written (what the forward does)."""
    cached = m.allocate(seq_id, tokens)
    m.commit(seq_id)
    return cached


PREFIX = list(range(100, 112))            # exactly 3 blocks


def test_common_three_block_prefix_shares_exactly_those_blocks():
    m = manager()
    assert run(m, "a", PREFIX + [1, 2, 3]) == 0
    assert run(m, "b", PREFIX + [7, 8, 9, 10, 11]) == 12
    a, b = m.block_table("a"), m.block_table("b")
    assert a[:3] == b[:3]
    assert not set(a[3:]) & set(b[3:])
    assert [m.ref_count(x) for x in a[:3]] == [2, 2, 2]
    assert m.ref_count(a[3]) == 1 and m.ref_count(b[3]) == 1
    assert m.stats().prefix_hit_blocks == 3


def test_refcounts_return_to_zero_and_blocks_stay_cached():
    m = manager()
    run(m, "a", PREFIX + [1])
    run(m, "b", PREFIX + [2])
    shared = m.block_table("a")[:3]
    m.free("a")
    assert [m.ref_count(x) for x in shared] == [1, 1, 1]
    m.free("b")
    assert [m.ref_count(x) for x in shared] == [0, 0, 0]
    stats = m.stats()
    assert stats.blocks_used == 0 and stats.blocks_cached == 3
    assert run(m, "c", PREFIX + [3]) == 12           # still a hit after both finished
    assert m.block_table("c")[:3] == shared


def test_whole_prompt_hit_still_leaves_one_token_to_compute():
    m = manager()
    run(m, "a", PREFIX)
    assert run(m, "b", PREFIX) == 8                  # last block recomputed for the logits


def test_different_earlier_block_means_no_hit_later():
    m = manager()
    run(m, "a", PREFIX + [1])
    other = [999] + PREFIX[1:] + [1]                 # same blocks 2 and 3, different block 1
    assert run(m, "b", other) == 0


def test_eviction_is_least_recently_used_and_tail_first():
    m = manager(num_blocks=6)
    run(m, "a", list(range(0, 8)) + [50])            # 3 blocks, 2 full hashed
    run(m, "b", list(range(20, 28)) + [60])          # 3 blocks, 2 full hashed
    a_full, b_full = m.block_table("a")[:2], m.block_table("b")[:2]
    m.free("a")                                      # a's blocks become cached first (older)
    m.free("b")
    assert m.stats().blocks_cached == 4 and m.stats().blocks_free == 2
    run(m, "c", list(range(40, 49)))                 # needs 3: 2 free + 1 evicted
    assert m.stats().evictions == 1
    # the evicted one is a's tail full block (a freed first, tail before head)
    assert a_full[1] in m.block_table("c")
    assert m.cached_prefix_tokens(list(range(0, 8)) + [1]) == 4
    assert m.cached_prefix_tokens(list(range(20, 28)) + [1]) == 8


def test_reusing_a_cached_block_refreshes_it_in_the_lru():
    m = manager(num_blocks=5)
    run(m, "a", list(range(0, 4)) + [1])             # hashed block A
    run(m, "b", list(range(10, 14)) + [1])           # hashed block B
    m.free("a")
    m.free("b")
    run(m, "c", list(range(0, 4)) + [2])             # revives A
    m.free("c")                                      # A is now most recent
    run(m, "d", list(range(30, 46)))                 # 4 blocks: 3 free + evicts B, not A
    assert m.stats().evictions == 1
    assert m.cached_prefix_tokens(list(range(0, 4)) + [9]) == 4
    assert m.cached_prefix_tokens(list(range(10, 14)) + [9]) == 0


def test_hash_collision_is_caught_by_the_token_check():
    m = manager(hash_fn=lambda prev, tokens: 42)     # every block collides
    run(m, "a", [1, 2, 3, 4, 5])
    assert run(m, "b", [9, 9, 9, 9, 5]) == 0         # same hash, different tokens: no hit
    assert not set(m.block_table("a")) & set(m.block_table("b"))
    assert run(m, "c", [1, 2, 3, 4, 6]) == 4         # genuine match still works


def test_uncommitted_blocks_are_not_shared():
    m = manager()
    m.allocate("a", PREFIX + [1])                    # K/V not written yet
    assert m.allocate("b", PREFIX + [2]) == 0


def test_sharing_can_be_disabled():
    m = manager(prefix_sharing=False)
    run(m, "a", PREFIX + [1])
    assert run(m, "b", PREFIX + [1]) == 0
    m.free("a")
    assert m.stats().blocks_cached == 0


def test_shared_blocks_are_never_written_by_the_cache():
    geom = KVGeometry(2, 1, 2)
    cache = Paged(KVBlockPool(16, BS, geom))
    k = torch.randn(2, 13, 1, 2)
    cache.create("a", PREFIX + [1], k, k)
    other = torch.randn(2, 13, 1, 2)
    assert cache.create("b", PREFIX + [2], other, other) == 12
    assert torch.equal(cache.read("a")[0], k)        # a's prefix K/V untouched
    assert torch.equal(cache.read("b")[0][:, :12], k[:, :12])
    assert torch.equal(cache.read("b")[0][:, 12:], other[:, 12:])


def test_block_map_names_each_blocks_state():
    m = manager(8)
    assert m.block_map() == "........"
    run(m, "a", PREFIX + [1])                         # 3 full blocks + 1 partial
    run(m, "b", PREFIX + [2])                         # shares the 3, adds its own partial
    a, b = m.block_table("a"), m.block_table("b")
    state = m.block_map()
    assert [state[x] for x in a[:3]] == ["s"] * 3 and state[a[3]] == state[b[3]] == "u"
    assert state.count(".") == 8 - 5
    m.free("a")
    m.free("b")
    state = m.block_map()
    assert [state[x] for x in a[:3]] == ["c"] * 3 and state.count(".") == 5  # partial blocks: no hash, freed
    assert len(state) == 8 and state.count("c") == m.stats().blocks_cached
