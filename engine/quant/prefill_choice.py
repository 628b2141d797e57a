"""Which way a ``q8`` prefill multiplies on this CPU, measured once per process.

Why measure: a prefill-sized call (64 rows and more) can unpack the weights to bf16 and run
oneDNN's GEMM, or stay in our integer kernel with two-byte activations. Which is faster
depends on the CPU's bf16 GEMM, not only on whether it has one: on a 2-core AMD EPYC with
AVX512-BF16 the GEMM won from ~64 rows (results/quant_kernels.csv), while on a 2-core Intel
Xeon with AVX512-BF16 the integer kernel was 1.2-1.3x faster at 64-280 rows (gate_up, down,
qkv shapes; a probe of 2026-12-01). So the first prefill call times both on a gate-sized
matrix, a few repeats interleaved, and keeps the GEMM only where it wins clearly; the choice
is logged (``q8_prefill_path``) and fixed for the process, so a worker's numbers do not change
from one request to the next.
"""
from __future__ import annotations

import logging
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

logger = logging.getLogger("miniserve.engine.quant")

PROBE_ROWS, PROBE_OUT, PROBE_IN = 128, 4864, 896   # a prefill of 128 tokens through gate
REPEATS = 5
MARGIN = 1.10                                      # the GEMM must be 10% faster to be chosen


def gemm_wins(kernel_ms: float, gemm_ms: float, margin: float = MARGIN) -> bool:
    """Whether unpacking + GEMM beats the integer kernel by the margin."""
    return gemm_ms * margin < kernel_ms


def _median_ms(fn: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def measure() -> dict[str, float]:
    """Median ms of one probe call each way (random weights: the speed does not depend on them)."""
    from engine.quant import q8

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(PROBE_OUT, PROBE_IN, generator=generator) * 0.02
    codes, scales = q8.quantize(weight)
    x = torch.randn(PROBE_ROWS, PROBE_IN, generator=generator).to(torch.bfloat16)

    def kernel() -> object:
        return q8.linear(x, codes, scales, None, precise=True)

    def gemm() -> object:
        return F.linear(x, q8.dequantize_bf16(codes, scales))

    kernel(), gemm()                                  # warm both
    kernel_times, gemm_times = [], []
    for _ in range(REPEATS):                          # interleaved: drift hits both
        kernel_times += _median_ms(kernel, 1)
        gemm_times += _median_ms(gemm, 1)
    return {"kernel_ms": statistics.median(kernel_times), "gemm_ms": statistics.median(gemm_times)}


def choose() -> bool:
    """Measure and decide (True: unpack + GEMM); logs the timings and the choice."""
    from core.logs import log_event

    timings = measure()
    wins = gemm_wins(timings["kernel_ms"], timings["gemm_ms"])
    log_event(logger, "q8_prefill_path", path="bf16_gemm" if wins else "integer_kernel",
              kernel_ms=round(timings["kernel_ms"], 3), gemm_ms=round(timings["gemm_ms"], 3), rows=PROBE_ROWS)
    return wins
