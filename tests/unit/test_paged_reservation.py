"""bench.paged_generation's reservation part: paged blocks against a contiguous cache that
reserves a fixed number of slots per request, on the original MiniServe workload."""
from __future__ import annotations

from bench.paged_generation import reservation


def test_blocks_hold_whole_blocks_per_request_and_save_against_the_reservation():
    bytes_per_token = 2 * 24 * 2 * 64 * 2          # K and V, 24 layers, 2 KV heads of 64, bf16
    rows, summary = reservation([17, 33, 65, 129], 16, 256, bytes_per_token)
    assert [r["paged_slots"] for r in rows] == [32, 48, 80, 144]
    assert [r["paged_empty_slots"] for r in rows] == [15, 15, 15, 15]
    assert summary["tokens"] == 244 and summary["allocation_saved_pct"] == 70.31
    assert summary["contiguous_mib"] == 12.0 and summary["paged_mib"] == 3.562
    assert summary["paged_fragmentation_pct"] == 19.74 and summary["contiguous_unused_pct"] == 76.17


def test_a_request_that_fills_its_blocks_leaves_no_empty_slot():
    rows, summary = reservation([32], 16, 64, 1)
    assert rows[0]["paged_slots"] == 32 and summary["paged_fragmentation_pct"] == 0.0
    assert summary["allocation_saved_pct"] == 50.0
