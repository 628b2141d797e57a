"""Logical KV allocation: paged blocks vs contiguous per-request reservations.

The original MiniServe workload: four requests of 17, 33, 65 and 129 tokens, block size 16,
and a contiguous cache that reserves 256 token slots per request.  The paged side runs the
real :class:`engine.paged.PagedKVCache` (default-model geometry) and reads its statistics.

    python -m bench.paged_kv_memory [--lengths 17 33 65 129] [--block-size 16] [--reserve 256]
"""
from __future__ import annotations

import argparse

import torch

from bench.paged_common import (DEFAULT_HEAD_DIM, DEFAULT_KV_HEADS, DEFAULT_LAYERS, RESULTS,
                                machine_line, print_table, pyplot, write_csv)
from engine.paged import KVGeometry, PagedKVCache


def run(lengths: list[int], block_size: int, reserve: int, dtype: torch.dtype) -> list[dict]:
    geom = KVGeometry(DEFAULT_LAYERS, DEFAULT_KV_HEADS, DEFAULT_HEAD_DIM)
    blocks = sum(-(-n // block_size) for n in lengths)
    cache = PagedKVCache(blocks, block_size, geom, dtype, prefix_sharing=False)
    bytes_per_token = geom.bytes_per_token(dtype)
    rows = []
    for index, n in enumerate(lengths):
        shape = (geom.num_layers, n, geom.num_kv_heads, geom.head_dim)
        k = torch.randn(shape).to(dtype)
        cache.create(index, list(range(n)), k, k)
        table = cache.blocks.block_table(index)
        paged_slots = len(table) * block_size
        rows.append({"request": index, "tokens": n, "contiguous_slots": reserve,
                     "paged_blocks": len(table), "paged_slots": paged_slots,
                     "paged_empty_slots": paged_slots - n,
                     "contiguous_empty_slots": reserve - n})
    stats = cache.stats()
    total_contig = reserve * len(lengths)
    total_paged = stats.blocks_used * block_size
    rows.append({"request": "total", "tokens": stats.logical_tokens,
                 "contiguous_slots": total_contig, "paged_blocks": stats.blocks_used,
                 "paged_slots": total_paged, "paged_empty_slots": stats.empty_slots,
                 "contiguous_empty_slots": total_contig - stats.logical_tokens})
    summary = {
        "logical_allocation_saved_pct": round(100 * (1 - total_paged / total_contig), 2),
        "paged_fragmentation_pct": round(100 * stats.fragmentation, 2),
        "contiguous_fragmentation_pct": round(
            100 * (total_contig - stats.logical_tokens) / total_contig, 2),
        "paged_share_of_contiguous_pct": round(100 * total_paged / total_contig, 2),
        "contiguous_mib": round(total_contig * bytes_per_token / 2**20, 3),
        "paged_mib": round(total_paged * bytes_per_token / 2**20, 3),
    }
    return rows, summary


def plot(rows: list[dict], path) -> None:
    plt = pyplot()
    reqs = [r for r in rows if r["request"] != "total"]
    labels = [str(r["tokens"]) for r in reqs]
    x = range(len(reqs))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([i - 0.2 for i in x], [r["contiguous_slots"] for r in reqs], 0.4,
           label="contiguous (reserved)")
    ax.bar([i + 0.2 for i in x], [r["paged_slots"] for r in reqs], 0.4, label="paged (blocks)")
    ax.plot(list(x), [r["tokens"] for r in reqs], "k_", markersize=20, label="tokens stored")
    ax.set_xticks(list(x), labels)
    ax.set_xlabel("request length (tokens)")
    ax.set_ylabel("KV token slots allocated")
    ax.set_title("Logical KV allocation per request")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[17, 33, 65, 129])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--reserve", type=int, default=256)
    parser.add_argument("--output", default=str(RESULTS / "paged_kv_memory.csv"))
    args = parser.parse_args()
    dtype = torch.bfloat16
    rows, summary = run(args.lengths, args.block_size, args.reserve, dtype)
    print(machine_line(dtype))
    print_table(rows)
    for key, value in summary.items():
        print(f"{key}: {value}")
    path = write_csv(__import__("pathlib").Path(args.output), rows)
    (path.with_suffix(".summary.csv")).write_text(
        ",".join(summary) + "\n" + ",".join(str(v) for v in summary.values()) + "\n")
    plot(rows, path.with_suffix(".png"))
    print(f"wrote {path}, {path.with_suffix('.summary.csv')}, {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()
