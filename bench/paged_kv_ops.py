"""Per-operation latency: contiguous KV reservation vs the paged KV cache.

Same four requests as the memory benchmark (17, 33, 65, 129 tokens, default-model K/V
geometry).  Each repeat runs, for all requests: create -> prefill append -> token append
(``--decode-tokens`` tokens, one at a time) -> attend (one query per layer, every layer) ->
free.  Contiguous reserves ``--reserve`` slots per request up front and reads a slice;
paged allocates blocks from a preallocated pool and attends through the block table with one
gather per layer.  Repeats alternate which side goes first; warmup runs are discarded.

    python -m bench.paged_kv_ops --repeats 20
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.paged_common import (DEFAULT_HEAD_DIM, DEFAULT_KV_HEADS, DEFAULT_LAYERS, RESULTS,
                                machine_line, p50, pct, print_table, pyplot, write_csv)
from engine.paged import KVGeometry, PagedKVCache

OPS = ("create", "prefill_append", "token_append", "attend", "free")
Q_HEADS = 14


class ContiguousKV:
    """The baseline: one ``[layers, reserve, kv_heads, dim]`` K and V per request."""

    def __init__(self, geom: KVGeometry, reserve: int, dtype: torch.dtype):
        self.geom, self.reserve, self.dtype = geom, reserve, dtype
        self.seqs: dict[int, list] = {}

    def create(self, seq_id: int) -> None:
        g = self.geom
        shape = (g.num_layers, self.reserve, g.num_kv_heads, g.head_dim)
        self.seqs[seq_id] = [torch.empty(shape, dtype=self.dtype),
                             torch.empty(shape, dtype=self.dtype), 0]

    def append(self, seq_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        entry = self.seqs[seq_id]
        n, end = entry[2], entry[2] + k.shape[1]
        if end > self.reserve:
            raise RuntimeError("reservation exceeded")
        entry[0][:, n:end] = k
        entry[1][:, n:end] = v
        entry[2] = end

    def attend(self, seq_id: int, q: torch.Tensor) -> torch.Tensor:
        """One query per layer (``[layers, heads, dim]``) over the reserved slice."""
        k, v, n = self.seqs[seq_id]
        out = []
        for layer in range(q.shape[0]):
            keys = k[layer, :n].transpose(0, 1)[None]
            values = v[layer, :n].transpose(0, 1)[None]
            out.append(F.scaled_dot_product_attention(q[layer][None, :, None], keys, values,
                                                      enable_gqa=True)[0, :, 0])
        return torch.stack(out)

    def free(self, seq_id: int) -> None:
        del self.seqs[seq_id]


def make_inputs(lengths, decode, geom, dtype):
    gen = torch.Generator().manual_seed(0)
    shape = lambda n: (geom.num_layers, n, geom.num_kv_heads, geom.head_dim)
    data = []
    for n in lengths:
        prefill = torch.randn(shape(n), generator=gen).to(dtype)
        tokens = [torch.randn(shape(1), generator=gen).to(dtype) for _ in range(decode)]
        data.append((n, prefill, tokens))
    query = torch.randn(geom.num_layers, Q_HEADS, geom.head_dim, generator=gen).to(dtype)
    return data, query


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_contiguous(store: ContiguousKV, data, query) -> dict[str, float]:
    t = {}
    ids = range(len(data))
    t["create"] = timed(lambda: [store.create(i) for i in ids])
    t["prefill_append"] = timed(lambda: [store.append(i, d[1], d[1]) for i, d in zip(ids, data)])
    t["token_append"] = timed(lambda: [store.append(i, tok, tok) for i, d in zip(ids, data)
                                       for tok in d[2]])
    t["attend"] = timed(lambda: [store.attend(i, query) for i in ids])
    t["free"] = timed(lambda: [store.free(i) for i in ids])
    return t


def run_paged(cache: PagedKVCache, data, query) -> dict[str, float]:
    t = {}
    ids = range(len(data))
    toks = {i: list(range(d[0])) for i, d in zip(ids, data)}
    slots: dict[int, torch.Tensor] = {}

    def create():
        for i in ids:
            cache.blocks.allocate(i, toks[i])
            slots[i] = torch.as_tensor(cache.blocks.slots(i, 0, len(toks[i])))

    def prefill():
        for i, d in zip(ids, data):
            cache.pool.write(slots[i], d[1], d[1])
            cache.blocks.commit(i)

    t["create"] = timed(create)
    t["prefill_append"] = timed(prefill)
    t["token_append"] = timed(lambda: [cache.append(i, [7], tok, tok) for i, d in zip(ids, data)
                                       for tok in d[2]])
    t["attend"] = timed(lambda: [cache.attend(i, query) for i in ids])
    t["free"] = timed(lambda: [cache.free(i) for i in ids])
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--lengths", type=int, nargs="+", default=[17, 33, 65, 129])
    parser.add_argument("--decode-tokens", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--reserve", type=int, default=256)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--output", default=str(RESULTS / "paged_kv_ops.csv"))
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    geom = KVGeometry(DEFAULT_LAYERS, DEFAULT_KV_HEADS, DEFAULT_HEAD_DIM)
    data, query = make_inputs(args.lengths, args.decode_tokens, geom, dtype)
    contiguous = ContiguousKV(geom, args.reserve, dtype)
    total = sum(-(-(n + args.decode_tokens) // args.block_size) for n in args.lengths)
    # Sharing off: every repeat inserts the same token ids and must do the same work.
    paged = PagedKVCache(total, args.block_size, geom, dtype, prefix_sharing=False)
    samples = {"contiguous": {op: [] for op in OPS}, "paged": {op: [] for op in OPS}}
    runners = {"contiguous": lambda: run_contiguous(contiguous, data, query),
               "paged": lambda: run_paged(paged, data, query)}
    for rep in range(args.warmup + args.repeats):
        order = ["contiguous", "paged"] if rep % 2 == 0 else ["paged", "contiguous"]
        for name in order:
            result = runners[name]()
            if rep >= args.warmup:
                for op, seconds in result.items():
                    samples[name][op].append(seconds * 1000)
    rows = []
    for op in OPS:
        c, p = samples["contiguous"][op], samples["paged"][op]
        rows.append({"operation": op, "contiguous_p50_ms": p50(c), "paged_p50_ms": p50(p),
                     "contiguous_mean_ms": sum(c) / len(c), "paged_mean_ms": sum(p) / len(p),
                     "paged_p90_ms": pct(p, 90), "paged_over_contiguous": p50(p) / p50(c)})
    print(machine_line(dtype))
    print(f"requests {args.lengths}, {args.decode_tokens} appended tokens each, "
          f"block {args.block_size}, reserve {args.reserve}, repeats {args.repeats} "
          f"(+{args.warmup} warmup), attend = 1 query x {geom.num_layers} layers per request")
    print_table(rows)
    path = write_csv(Path(args.output), rows)
    plot(rows, path.with_suffix(".png"))
    print(f"wrote {path}, {path.with_suffix('.png')}")


def plot(rows, path) -> None:
    plt = pyplot()
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([i - 0.2 for i in x], [r["contiguous_p50_ms"] for r in rows], 0.4, label="contiguous")
    ax.bar([i + 0.2 for i in x], [r["paged_p50_ms"] for r in rows], 0.4, label="paged")
    ax.set_xticks(list(x), [r["operation"] for r in rows])
    ax.set_ylabel("p50 ms (4 requests)")
    ax.set_yscale("log")
    ax.set_title("KV cache operations: contiguous vs paged")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
