"""Which way a prefill multiplies on this CPU, measured once per process and weight format.

Why measure: a prefill-sized call (64 rows and more) can unpack the weights to bf16 and run
oneDNN's GEMM, or stay in our integer kernel with two-byte activations. Which is faster
depends on the CPU's bf16 GEMM, not only on whether it has one: on a 2-core AMD EPYC with
AVX512-BF16 the GEMM won from ~64 rows (results/quant_kernels.csv), while on a 2-core Intel
Xeon with AVX512-BF16 the integer kernel was 1.2-1.3x faster at 64-280 rows (gate_up, down,
qkv shapes). So the load times both on a gate-sized matrix (``engine.quant.model.decide_prefill_paths``,
before the worker's first prompt, which would otherwise wait for it), a few repeats interleaved, and keeps the GEMM only where it wins clearly; the choice
is logged (``q8_prefill_path``) and fixed for the process, so a worker's numbers do not change
from one request to the next.

GGUF's formats interleaved by 16 rows ask the same question, once each (``gguf_prefill_path``
with the format, :mod:`engine.quant.gguf_blocks`): their kernels read one weight load against
four activation rows with one ``vpdpbusd`` each, and on the AMD EPYC above they ran 1.2-2.3x
the bf16 GEMM at 512 rows (results/gguf_kernels.json); a CPU with AMX tiles may well answer the
other way.
"""
from __future__ import annotations

import logging
import statistics
import time
from typing import Callable

from core.logs import log_event

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


def measure(kernel: Callable[[], object], gemm: Callable[[], object]) -> dict[str, float]:
    """Median ms of one probe call each way: ``kernel`` and ``gemm`` run the same prefill-sized
    matmul (:data:`PROBE_ROWS` x :data:`PROBE_IN` -> :data:`PROBE_OUT`) through the integer
    kernel and through unpacking + the bf16 GEMM. The caller (engine.quant.q8) builds them, so
    this module needs no kernel of its own."""
    kernel(), gemm()                                  # warm both
    kernel_times, gemm_times = [], []
    for _ in range(REPEATS):                          # interleaved: drift hits both
        kernel_times += _median_ms(kernel, 1)
        gemm_times += _median_ms(gemm, 1)
    return {"kernel_ms": statistics.median(kernel_times), "gemm_ms": statistics.median(gemm_times)}


def choose(kernel: Callable[[], object], gemm: Callable[[], object], weights: str = "q8",
           rows: int = PROBE_ROWS, **context: str) -> bool:
    """Measure and decide (True: unpack + GEMM); logs the timings and the choice as
    ``<weights>_prefill_path``. ``rows``: the probe's row count, for the log; ``context``: more
    fields for it (GGUF's block format)."""
    timings = measure(kernel, gemm)
    wins = gemm_wins(timings["kernel_ms"], timings["gemm_ms"])
    log_event(logger, f"{weights}_prefill_path", path="bf16_gemm" if wins else "integer_kernel",
              kernel_ms=round(timings["kernel_ms"], 3), gemm_ms=round(timings["gemm_ms"], 3), rows=rows, **context)
    return wins
