"""Rolling back rejected drafts in the paged block manager: block tables, reference
counts, the free list and the prefix hashes stay correct."""
from __future__ import annotations

import pytest

from engine.paged.block_manager import BlockManager


def _check_counts(bm: BlockManager) -> None:
    s = bm.stats()
    assert s.blocks_used + s.blocks_free + s.blocks_cached == s.num_blocks
    held = {}
    for seq in bm._seqs.values():
        for block_id in seq.block_ids:
            held[block_id] = held.get(block_id, 0) + 1
    for block_id in range(bm.num_blocks):
        assert bm.ref_count(block_id) == held.get(block_id, 0)


def test_truncate_within_the_last_block_keeps_the_table():
    bm = BlockManager(8, 4)
    bm.allocate("a", [1, 2, 3, 4, 5])
    bm.commit("a")
    table = bm.block_table("a")
    slots = bm.append("a", [6, 7])               # two drafts, same block
    assert slots == bm.slots("a", 5, 7)
    bm.truncate("a", 6)                           # one accepted
    assert bm.block_table("a") == table and bm.num_tokens("a") == 6
    assert bm.stats().blocks_used == 2
    _check_counts(bm)


def test_truncate_frees_blocks_taken_for_rejected_drafts_and_reuses_them():
    bm = BlockManager(8, 4)
    bm.allocate("a", [1, 2, 3])
    bm.commit("a")
    bm.append("a", [4, 5, 6, 7, 8, 9])           # drafts spill into two new blocks
    assert len(bm.block_table("a")) == 3
    extra = bm.block_table("a")[1:]
    bm.truncate("a", 4)
    assert len(bm.block_table("a")) == 1 and bm.stats().blocks_used == 1
    assert all(bm.ref_count(b) == 0 for b in extra)
    bm.append("a", [5])                           # the next block taken is one just freed
    assert bm.block_table("a")[1] in extra
    _check_counts(bm)


def test_committed_tokens_cannot_be_truncated():
    bm = BlockManager(8, 4)
    bm.allocate("a", [1, 2, 3, 4, 5])
    bm.commit("a", 5)
    bm.append("a", [6])
    with pytest.raises(ValueError):
        bm.truncate("a", 4)
    with pytest.raises(ValueError):
        bm.truncate("a", 7)


def test_shared_prefix_blocks_untouched_by_a_sharers_drafts():
    bm = BlockManager(16, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    bm.allocate("a", prompt)
    bm.commit("a")
    assert bm.allocate("b", prompt) == 8         # two full blocks shared
    shared = bm.block_table("b")[:2]
    bm.commit("b")
    slots = bm.append("b", [20, 21, 22, 23, 24])  # drafts: only b's private blocks
    assert all(slot // 4 not in shared for slot in slots)
    bm.truncate("b", 10)
    assert bm.block_table("b")[:2] == shared
    assert all(bm.ref_count(b) == 2 for b in shared)
    _check_counts(bm)
    bm.free("a")
    bm.free("b")
    assert bm.cached_prefix_tokens(prompt) == 8   # still hashed, still valid


def test_only_final_tokens_are_hashed():
    """A block filled with drafts that were later rejected must never be found by hash."""
    bm = BlockManager(16, 4)
    bm.allocate("a", [1, 2, 3])
    bm.commit("a")
    bm.append("a", [4, 90, 91, 92, 93])           # drafts fill block 0 and spill over
    bm.truncate("a", 5)                           # accepted: 4 and 90; 91.. rejected
    bm.commit("a", 5)
    bm.append("a", [50, 51, 52])                  # the real continuation
    bm.commit("a")
    bm.free("a")
    assert bm.cached_prefix_tokens([1, 2, 3, 4, 90, 50, 51, 52, 0]) == 8
    assert bm.cached_prefix_tokens([1, 2, 3, 4, 90, 91, 92, 93, 0]) == 4
    _check_counts(bm)
