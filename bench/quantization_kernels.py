"""Micro-benchmark: the default model's linear shapes, bf16 (plain and prepacked, where this
CPU's oneDNN has bf16 kernels) vs q8 (as in prefill / single decode, and as in a
batched decode step), and q8's 5-bit storage of Q5_0 grids (``q5``) beside it: whether 5 bits
read faster than 8 on this CPU's vector path is what ``q8.FIVE_BIT_PATHS`` records.

Run as ``python -m bench.quantization --kernels``. Weights are random (speed does not
depend on values). Each shape is held in as many copies as the model has layers and one
timed pass walks all copies, so the weights stream from memory as in a real decode step
(a single warm copy would sit in cache and flatter every kernel). Reported per layer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench.stats import pyplot
from engine.packed import PackedLinear, packing_available
from engine.quant import q8
from engine.quant.layer import quantize_linear
from engine.quant.layer import QuantizedLinear
from engine.weights import Linear

HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 896, 4864, 24, 151936
SHAPES = {  # name: (out_features, in_features, copies)
    "q_proj": (14 * 64, HIDDEN, LAYERS), "k_proj": (2 * 64, HIDDEN, LAYERS),
    "v_proj": (2 * 64, HIDDEN, LAYERS), "o_proj": (HIDDEN, 14 * 64, LAYERS),
    "gate_proj": (INTERMEDIATE, HIDDEN, LAYERS), "up_proj": (INTERMEDIATE, HIDDEN, LAYERS),
    "down_proj": (HIDDEN, INTERMEDIATE, LAYERS), "lm_head": (VOCAB, HIDDEN, 1),
}
MODES = ("bf16", "bf16_packed", "q8", "q5", "q8_batched")


@dataclass
class KernelRow:
    shape: str
    out_features: int
    in_features: int
    rows: int
    mode: str
    ms_p50: float
    speedup_vs_bf16: float = 0.0


def _ops(n: int, k: int, copies: int) -> dict[str, list]:
    """Per mode, ``copies`` callables x -> y over distinct weights (packed kernel forced)."""
    packed = packing_available(torch.bfloat16, torch.device("cpu"))
    ops: dict[str, list] = {m: [] for m in MODES if packed or m != "bf16_packed"}
    gen = torch.Generator().manual_seed(n + k)
    for _ in range(copies):
        w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
        ops["bf16"].append(lambda x, w=w: F.linear(x, w))
        if packed:
            ops["bf16_packed"].append(PackedLinear.from_linear(Linear(w)))    # what `none` runs
        ops["q8"].append(quantize_linear(w, None))
        ops["q5"].append(_five_bit(ops["q8"][-1]))
        ops["q8_batched"].append(_in_batched_decode(ops["q8"][-1]))
    return ops


def _five_bit(layer: QuantizedLinear) -> QuantizedLinear:
    """The same shape stored as a Q5_0 tensor is (codes clipped to -16..15, packed in 5 bits),
    whatever this CPU's default storage: values do not change the speed."""
    codes = q8.deinterleave(layer.qweight).to(torch.int16).clamp(128 - 16, 128 + 15).to(torch.uint8)
    return QuantizedLinear(mode="q5", in_features=layer.in_features, out_features=layer.out_features,
                           qweight=q8.pack5(q8.interleave(codes)), params=layer.params, group_size=q8.GROUP,
                           bias=None, kernel_bias=None)


def _in_batched_decode(layer):
    """q8 as the paged scheduler runs it in a decode-only step (one-byte activations above 4 rows)."""
    def call(x: torch.Tensor) -> torch.Tensor:
        with q8.batched_decode():
            return layer(x)
    return call


def _time_pass(fns: list, x: torch.Tensor) -> float:
    started = time.perf_counter()
    for fn in fns:
        fn(x)
    return (time.perf_counter() - started) / len(fns)


def run_kernels(rows_list: list[int], repeats: int) -> list[KernelRow]:
    out: list[KernelRow] = []
    for name, (n, k, copies) in SHAPES.items():
        ops = _ops(n, k, copies)
        for rows in rows_list:
            x = torch.randn(rows, k).to(torch.bfloat16)
            times: dict[str, list[float]] = {m: [] for m in ops}
            for mode in ops:  # warmup
                _time_pass(ops[mode], x)
            for _ in range(repeats):  # interleaved
                for mode in ops:
                    times[mode].append(_time_pass(ops[mode], x))
            p50 = {m: sorted(t)[len(t) // 2] * 1e3 for m, t in times.items()}
            for mode in ops:
                out.append(KernelRow(name, n, k, rows, mode, round(p50[mode], 4),
                                     round(p50["bf16"] / p50[mode], 3)))
        del ops
    return out


def model_totals(rows: list[KernelRow]) -> list[dict]:
    """Sum over one decode step's matmuls (every layer's projections + lm_head) per rows."""
    totals: dict[tuple[int, str], float] = {}
    for r in rows:
        weight = SHAPES[r.shape][2]
        totals[(r.rows, r.mode)] = totals.get((r.rows, r.mode), 0.0) + r.ms_p50 * weight
    out = []
    for (n_rows, mode), ms in sorted(totals.items()):
        base = totals[(n_rows, "bf16")]
        out.append({"rows": n_rows, "mode": mode, "step_ms": round(ms, 2),
                    "speedup_vs_bf16": round(base / ms, 2)})
    return out


def plot_totals(totals: list[dict], path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode in MODES:
        pts = [(t["rows"], t["step_ms"]) for t in totals if t["mode"] == mode]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows per matmul (sequences in the batch)")
    ax.set_ylabel("ms per decode step (all linears + lm_head)")
    ax.set_title("Qwen2.5-0.5B linear shapes, weight-only kernels, CPU")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
