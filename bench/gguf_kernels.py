"""Micro-benchmark of the GGUF block kernels (engine.quant.gguf_native): ``python -m bench.gguf_kernels``.

For each block format at real shapes (Qwen2.5-1.5B's 1536x1536, 8960x1536, 1536x8960 and a
151936-row head): batch-1 time (p50 after warmup), the effective GB/s (the weight's bytes /
time) beside the machine's measured read bandwidth (a torch ``sum`` over 512 MB) and beside the
``q8`` kernel at the same shape; then, at 512 rows, GFLOP/s of the integer kernel and of the
prefill alternative (slabs dequantized natively to bf16, torch's GEMM; float32 beside it), and the row count where
the alternative starts to win (what ``gguf_blocks.dequant_min_rows`` holds).

Weights are random blocks (speed does not depend on values; scales are sane fp16). Each shape
is held in enough copies that one timed pass reads twice what the last-level cache holds, so the
weights stream from memory as in a decode step. Writes ``results/gguf_kernels.json``.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from bench.stats import (beyond_cache_mb, last_level_cache_bytes, machine_info, percentile, print_table,
                         read_bandwidth_gbs, write_json)
from engine.quant import gguf_native, q8
from engine.quant.gguf_blocks import random_blocks, slab_matmul

# *_X16: interleaved by 16 rows, as a VNNI CPU runs a Q4_K_M file's matrices.
FORMATS = ("Q4_K_X16", "Q4_K", "Q6_K_X16", "Q6_K", "Q5_0_X16", "Q5_0", "Q8_0_X16", "Q8_0", "Q5_K", "Q4_0", "Q4_1")
SHAPES = {"attn 1536x1536": (1536, 1536), "up 8960x1536": (8960, 1536), "down 1536x8960": (1536, 8960)}
HEAD_ROWS = 151936
# a timed pass reads at least this much: twice the last-level cache the CPU reports (an EPYC's
# 32 MB; a Xeon VM reports 480 MB, where 64 MB passes read 45-50 GB/s against 22 from memory)
STREAM_BYTES = max(64 * 2**20, 2 * last_level_cache_bytes())
PREFILL_SHAPE = (1536, 1536)
PREFILL_ROWS = (8, 16, 32, 64, 128, 512)


def ggml_type_of(fmt: str) -> T:
    return T[fmt.removesuffix("_X16")]


def weight_of(fmt: str, n: int, k: int, rng: np.random.Generator):
    """Random blocks of the format, interleaved for the ``_X16`` one."""
    weight = random_blocks(ggml_type_of(fmt), n, k, rng)
    return weight.interleave() if fmt.endswith("_X16") else weight


def matmul(x: torch.Tensor, weight) -> torch.Tensor:
    return gguf_native.matmul(x, weight.ggml_type, weight.data, weight.in_features, interleaved=weight.interleaved)


def head_shape(ggml_type: T) -> tuple[int, int]:
    """The head at the smallest hidden size the format's blocks divide (896 is not whole 256s)."""
    return (HEAD_ROWS, 896) if GGML_QUANT_SIZES[ggml_type][0] == 32 else (HEAD_ROWS, 1536)


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
_clock = time.perf_counter


def p50_pass(fns: list, x: torch.Tensor, repeats: int) -> float:
    """Median seconds of one call, over passes that call every copy once (after one warm pass)."""
    for fn in fns:
        fn(x)
    times = []
    for _ in range(repeats):
        started = _clock()
        for fn in fns:
            fn(x)
        times.append((_clock() - started) / len(fns))
    return percentile(times, 50)


def cpu_read_bandwidth_gbs(mb: int | None = None, repeats: int = 7) -> float:
    """One thread's read bandwidth by its own CPU time (a ``sum`` over ``mb`` MB of float32)."""
    data = torch.ones((mb or beyond_cache_mb()) * 2**20 // 4)
    return data.numel() * 4 / p50_pass([lambda x: data.sum()], data, repeats) / 1e9


def copies_for(nbytes: int) -> int:
    return max(1, -(-STREAM_BYTES // nbytes))


def q8_seconds(n: int, k: int, repeats: int) -> float:
    """The q8 kernel at the same shape (random codes: speed does not depend on values)."""
    x = torch.randn(1, k).to(torch.bfloat16)
    codes = [(torch.randint(0, 256, (n, k), dtype=torch.uint8), torch.full((n, k // 32), 0.01, dtype=torch.float16))
             for _ in range(copies_for(n * k + n * k // 16))]
    return p50_pass([lambda x, c=c, s=s: q8.linear(x, c, s, None) for c, s in codes], x, repeats)


def decode_row(fmt: str, name: str, n: int, k: int, repeats: int, rng: np.random.Generator,
               bandwidth: float, q8_cache: dict) -> dict:
    ggml_type = ggml_type_of(fmt)
    nbytes = n * k // GGML_QUANT_SIZES[ggml_type][0] * GGML_QUANT_SIZES[ggml_type][1]
    weights = [weight_of(fmt, n, k, rng) for _ in range(copies_for(nbytes))]
    x = torch.randn(1, k).to(torch.bfloat16)
    seconds = p50_pass([lambda x, w=w: matmul(x, w) for w in weights], x, repeats)
    del weights
    if (n, k) not in q8_cache:
        q8_cache[(n, k)] = q8_seconds(n, k, repeats)
    q8_time, q8_bytes = q8_cache[(n, k)], n * k + n * k // 32 * 2
    gbs, q8_gbs = nbytes / seconds / 1e9, q8_bytes / q8_time / 1e9
    return {"format": fmt, "shape": name, "out_features": n, "in_features": k, "ms_p50": round(seconds * 1e3, 4),
            "gb_s": round(gbs, 2), "of_bandwidth": round(gbs / bandwidth, 3), "q8_ms_p50": round(q8_time * 1e3, 4),
            "q8_gb_s": round(q8_gbs, 2), "speedup_vs_q8": round(q8_time / seconds, 3)}


def prefill_rows(fmt: str, repeats: int, rng: np.random.Generator) -> list[dict]:
    n, k = PREFILL_SHAPE
    weight = weight_of(fmt, n, k, rng)
    out = []
    for m in PREFILL_ROWS:
        x = torch.randn(m, k).to(torch.bfloat16)
        integer = p50_pass([lambda x: matmul(x, weight)], x, repeats)
        slab = p50_pass([lambda x: slab_matmul(x, weight, torch.bfloat16)], x, repeats)
        slab32 = p50_pass([lambda x: slab_matmul(x, weight, torch.float32)], x, repeats)
        flops = 2.0 * m * n * k
        out.append({"format": fmt, "rows": m, "shape": f"{n}x{k}",
                    "integer_ms": round(integer * 1e3, 3), "integer_gflop_s": round(flops / integer / 1e9, 1),
                    "dequant_gemm_ms": round(slab * 1e3, 3), "dequant_gemm_gflop_s": round(flops / slab / 1e9, 1),
                    "dequant_f32_gemm_ms": round(slab32 * 1e3, 3),
                    "faster": "integer" if integer <= slab else "dequant_gemm"})
    return out


def crossover(rows: list[dict]) -> int | None:
    """The fewest rows from which dequantize + GEMM wins at every measured count."""
    wins = [r["rows"] for r in rows if r["faster"] == "dequant_gemm"]
    ordered = sorted({r["rows"] for r in rows})
    for m in ordered:
        if all(r["faster"] == "dequant_gemm" for r in rows if r["rows"] >= m):
            return m
    return None if not wins else max(wins)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--no-prefill", action="store_true")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="cpu: the calling thread's CPU time (one thread only): the kernels' own speed "
                             "on a machine shared with other work, where wall time counts descheduled time")
    parser.add_argument("--out", default="results/gguf_kernels.json")
    args = parser.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu times one thread: use --threads 1")
    global _clock
    _clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    formats = [f for f in args.formats.split(",")
               if not f.endswith("_X16") or gguf_native.interleaves(ggml_type_of(f), 16)]   # the layouts this CPU reads
    bandwidth = cpu_read_bandwidth_gbs() if args.clock == "cpu" else read_bandwidth_gbs()
    print(f"read bandwidth ({args.threads} threads): {bandwidth:.1f} GB/s; gguf path {gguf_native.vector_path()}")
    rng = np.random.default_rng(0)
    decode, prefill, q8_cache = [], [], {}
    for fmt in formats:
        for name, (n, k) in {**SHAPES, "head": head_shape(ggml_type_of(fmt))}.items():
            decode.append(decode_row(fmt, name, n, k, args.repeats, rng, bandwidth, q8_cache))
            print(decode[-1], flush=True)
        if not args.no_prefill:
            prefill += prefill_rows(fmt, max(3, args.repeats // 3), rng)
    print()
    print_table(decode)
    if prefill:
        print()
        print_table(prefill)
    crossings = {f: crossover([r for r in prefill if r["format"] == f]) for f in formats} if prefill else {}
    write_json(Path(args.out), {**machine_info(), "threads": args.threads, "clock": args.clock,
                                "load_average": list(os.getloadavg()), "read_bandwidth_gbs": round(bandwidth, 2),
                                "gguf_vector_path": gguf_native.vector_path(), "decode": decode, "prefill": prefill,
                                "dequant_gemm_from_rows": crossings})
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
