"""GGUF block-quantized weights, run as they are in the file: the one interface the loader uses.

A :class:`BlockWeight` is one matrix ``[out_features, in_features]`` kept as GGUF stores it:
each row is ``in_features / block_elems`` blocks of the tensor's own type (Q4_K, Q6_K, ...),
``row_bytes`` bytes a row, usually a view of the memory-mapped file. :func:`block_matmul` is
``x @ W.T`` over those bytes without ever building a full-precision ``W``.

This module holds the contract, the reference (dequantize a bounded slab of rows with gguf-py,
multiply in float32) and the dispatch to the C kernels (:mod:`engine.quant.gguf_native`), which
tests compare with the reference.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from engine.packed import packing_available
from engine.quant import gguf_native, prefill_choice

# The block formats a quantized GGUF of the files people run brings (Q4_K_M, Q5_K_M, Q8_0,
# Q4_0, SmolLM2's Q4_1, the default model's Q5_0 fallbacks).
BLOCK_TYPES: frozenset[GGMLQuantizationType] = frozenset({
    GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K,
    GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q8_0,
})
_SLAB_ROWS = 1024  # rows dequantized at a time (reference and prefill): bounds the float32 peak
# Calls of at least this many rows (prefill), on a CPU with bf16 GEMM kernels, dequantize slabs to
# bf16 and run torch's GEMM: compute-bound there, it beat the integer kernels (one thread, AMD EPYC
# with AVX512-BF16, 1536x1536: Q4_K 4.5 ms against 5.5 at 128 rows and 13.8 against 23.7 at 512,
# equal at 64; Q8_0 ahead from 64 rows). A float32 GEMM was at best even with those (VNNI) integer
# kernels up to 512 rows; CPUs without bf16 GEMM see F32_MIN_ROWS_32 below. ``python -m
# bench.gguf_kernels`` measures the crossing per format (results/gguf_kernels.json).
DEQUANT_MIN_ROWS_K, DEQUANT_MIN_ROWS_32 = 128, 64
# Except the formats interleaved by 16 rows, whose kernels beat the GEMM at every prefill size
# there (results/gguf_kernels.json, 1536x1536, 2 threads: at 512 rows Q4_K 1.8x, Q6_K 1.2x,
# Q5_0 1.8x, Q8_0 2.3x): which way it goes is measured once per process and format
# (:func:`_x16_gemm_wins`), on a gate-sized matrix of Qwen2.5-1.5B's width.
X16_PROBE_OUT, X16_PROBE_IN = 4864, 1536
# Without bf16 GEMM kernels (AVX2 CPUs) the 32-input formats' integer kernels are compute-bound
# at prefill sizes, and from this many rows a float32 GEMM over slabs dequantized to float32
# beats them (2-core AMD EPYC with AVX2, 2 threads, 8960x1536 and 1536x8960: Q5_0 1.12-1.25x at
# 128 rows and 1.5x at 512, Q8_0 even at 128 and 1.16-1.49x at 512). The K formats' kernels stay
# ahead there or even (the GEMM took 0.99-2.4x their time at 128-512 rows), and interleaved weights
# keep their own kernels (on AVX2, interleaved Q5_0: 0.7-1.1x the float32 GEMM's time at 256-512
# rows, 4864x896 and 896x4864).
F32_MIN_ROWS_32 = 256
# The fp16 scale fields of a block that random blocks (probes, benchmarks, tests) set to sane
# values: the rest of a block's bytes may be anything.
SCALE_FIELDS = {GGMLQuantizationType.Q4_0: (0,), GGMLQuantizationType.Q4_1: (0, 2), GGMLQuantizationType.Q5_0: (0,),
                GGMLQuantizationType.Q8_0: (0,), GGMLQuantizationType.Q4_K: (0, 2), GGMLQuantizationType.Q5_K: (0, 2),
                GGMLQuantizationType.Q6_K: (208,)}


@dataclass(eq=False)
class BlockWeight:
    """One matrix in a GGUF block format: ``data`` is uint8 ``[out_features, row_bytes]``.
    ``interleaved``: rows interleaved by 16 (:func:`engine.quant.gguf_native.repack_x16`;
    the same bytes, so the same shape)."""

    ggml_type: GGMLQuantizationType
    out_features: int
    in_features: int
    data: torch.Tensor
    interleaved: bool = False

    def __post_init__(self) -> None:
        block_elems, block_bytes = GGML_QUANT_SIZES[self.ggml_type]
        if self.in_features % block_elems:
            raise ValueError(f"{self.ggml_type.name}: {self.in_features} inputs are not whole blocks of {block_elems}")
        expected = (self.out_features, self.in_features // block_elems * block_bytes)
        if tuple(self.data.shape) != expected or self.data.dtype != torch.uint8:
            raise ValueError(f"{self.ggml_type.name} data is {tuple(self.data.shape)} {self.data.dtype}, "
                             f"expected uint8 {expected}")

    @property
    def row_bytes(self) -> int:
        return int(self.data.shape[1])

    @property
    def nbytes(self) -> int:
        return self.out_features * self.row_bytes

    @property
    def kernel_type(self) -> int:
        """The type id gguf.c reads these bytes as (ggml's, or its interleaved layout's)."""
        return gguf_native.kernel_type(self.ggml_type, self.interleaved)

    def rows(self, start: int, stop: int) -> "BlockWeight":
        """Rows ``start:stop`` (a view: blocks never cross rows, nor groups of 16 when interleaved)."""
        group = gguf_native.X16_ROWS if self.interleaved else 1
        if start % group or (stop % group and stop != self.out_features):
            raise ValueError(f"rows {start}:{stop} split a group of {group} interleaved rows")
        return BlockWeight(self.ggml_type, stop - start, self.in_features, self.data[start:stop], self.interleaved)

    def interleave(self) -> "BlockWeight":
        """The same matrix interleaved by 16 for this CPU's decode kernel, or itself where that
        does not apply (another type, rows not whole groups, no kernel for that layout on this CPU)."""
        if self.interleaved or not gguf_native.interleaves(self.ggml_type, self.out_features):
            return self
        return BlockWeight(self.ggml_type, self.out_features, self.in_features,
                           gguf_native.repack_x16(self.data, self.ggml_type, self.in_features), interleaved=True)


def random_blocks(ggml_type: GGMLQuantizationType, out_features: int, in_features: int,
                  rng: np.random.Generator) -> BlockWeight:
    """Random blocks of a format with sane fp16 scales (0.001-0.02): for probes and benchmarks,
    whose speed does not depend on the values."""
    elems, nbytes = GGML_QUANT_SIZES[ggml_type]
    blocks = in_features // elems
    raw = rng.integers(0, 256, size=(out_features, blocks, nbytes), dtype=np.uint8)
    for offset in SCALE_FIELDS[ggml_type]:
        scales = rng.uniform(0.001, 0.02, size=(out_features, blocks)).astype(np.float16)
        raw[:, :, offset:offset + 2] = scales.view(np.uint8).reshape(out_features, blocks, 2)
    return BlockWeight(ggml_type, out_features, in_features, torch.from_numpy(raw.reshape(out_features, -1)))


def dequantize_rows(weight: BlockWeight, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Rows ``start:stop`` of the weight in float32, by gguf-py's own dequantization (the reference)."""
    stop = weight.out_features if stop is None else stop
    raw = weight.rows(start, stop).data.numpy()
    if weight.interleaved:
        raw = uninterleave_x16(raw, weight.ggml_type)
    values = gguf_dequantize(np.ascontiguousarray(raw), weight.ggml_type)
    return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(stop - start, weight.in_features))


def uninterleave_x16(raw: np.ndarray, ggml_type: GGMLQuantizationType) -> np.ndarray:
    """Rows back from :func:`engine.quant.gguf_native.repack_x16`'s layout, written
    independently of the C code (the reference reads ggml's own blocks). Per group of 16 rows and
    super-block, Q4_K: d[16], dmin[16], the scales' three words u0[16], u1[16], u2[16], then the
    codes as [4][8][16 rows][4 bytes]; Q6_K: :func:`_uninterleave_q6_k`; Q5_0 and Q8_0:
    :func:`_uninterleave_32`."""
    if ggml_type == GGMLQuantizationType.Q6_K:
        return _uninterleave_q6_k(raw)
    if ggml_type in (GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q8_0):
        return _uninterleave_32(raw, ggml_type)
    rows, row_bytes = raw.shape
    blocks = row_bytes // 144
    group = raw.reshape(rows // 16, blocks, 16 * 144)
    d, dmin = (group[..., at:at + 32].reshape(rows // 16, blocks, 16, 2) for at in (0, 32))
    words = group[..., 64:256].reshape(rows // 16, blocks, 3, 16, 4).transpose(0, 1, 3, 2, 4)
    codes = group[..., 256:].reshape(rows // 16, blocks, 4, 8, 16, 4).transpose(0, 1, 4, 2, 3, 5)
    block = np.concatenate([d, dmin, words.reshape(rows // 16, blocks, 16, 12),
                            codes.reshape(rows // 16, blocks, 16, 128)], axis=-1)
    return np.ascontiguousarray(block.transpose(0, 2, 1, 3)).reshape(rows, row_bytes)


def _uninterleave_q6_k(raw: np.ndarray) -> np.ndarray:
    """Q6_K: per group and super-block d[16] (fp16), the int8 scales as [8 pairs][16 rows][2],
    then per half h and k < 8 three [16 rows][4 bytes]: ql bytes 64h + 4k, ql bytes 64h + 32 + 4k,
    qh bytes 32h + 4k (each 4 of them); a row's block is ql[128], qh[64], scales[16], d."""
    rows, row_bytes = raw.shape
    blocks, groups = row_bytes // 210, rows // 16
    group = raw.reshape(groups, blocks, 16 * 210)
    d = group[..., :32].reshape(groups, blocks, 16, 2)
    scales = group[..., 32:288].reshape(groups, blocks, 8, 16, 2).transpose(0, 1, 3, 2, 4).reshape(groups, blocks, 16, 16)
    codes = group[..., 288:].reshape(groups, blocks, 2, 8, 3, 16, 4).transpose(0, 1, 5, 2, 4, 3, 6)  # [.., row, h, kind, k, 4]
    ql = codes[..., :2, :, :].reshape(groups, blocks, 16, 128)
    qh = codes[..., 2, :, :].reshape(groups, blocks, 16, 64)
    block = np.concatenate([ql, qh, scales, d], axis=-1)
    return np.ascontiguousarray(block.transpose(0, 2, 1, 3)).reshape(rows, row_bytes)


def _uninterleave_32(raw: np.ndarray, ggml_type: GGMLQuantizationType) -> np.ndarray:
    """Q5_0 and Q8_0: per group and block d[16] (fp16), Q5_0's qh[16] (4 bytes each), then the
    codes as [k][16 rows][4 bytes] (a row's code bytes 4k .. 4k + 3); a row's block is d, (qh,)
    codes."""
    rows, row_bytes = raw.shape
    block_bytes = GGML_QUANT_SIZES[ggml_type][1]
    blocks, groups, head = row_bytes // block_bytes, rows // 16, 6 if ggml_type == GGMLQuantizationType.Q5_0 else 2
    group = raw.reshape(groups, blocks, 16 * block_bytes)
    d = group[..., :32].reshape(groups, blocks, 16, 2)
    qh = group[..., 32:16 * head].reshape(groups, blocks, 16, head - 2)
    codes = group[..., 16 * head:].reshape(groups, blocks, -1, 16, 4).transpose(0, 1, 3, 2, 4)
    block = np.concatenate([d, qh, codes.reshape(groups, blocks, 16, block_bytes - head)], axis=-1)
    return np.ascontiguousarray(block.transpose(0, 2, 1, 3)).reshape(rows, row_bytes)


def reference_matmul(x2d: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """``x2d @ W.T`` in float32 over the dequantized weight, a slab of rows at a time."""
    x = x2d.to(torch.float32)
    out = torch.empty(x.shape[0], weight.out_features, dtype=torch.float32)
    for start in range(0, weight.out_features, _SLAB_ROWS):
        stop = min(start + _SLAB_ROWS, weight.out_features)
        out[:, start:stop] = x @ dequantize_rows(weight, start, stop).T
    return out


def block_matmul(x2d: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """``x2d [m, in_features] @ W.T`` -> float32 ``[m, out_features]``, W in its block format.

    Decode sizes: the C block kernels (activations quantized per block to int8,
    :mod:`engine.quant.gguf_native`). Prefill sizes (:func:`dequant_min_rows` and more) on a CPU
    with bf16 GEMM: :func:`slab_matmul` in bf16, faster there (``python -m bench.gguf_kernels``),
    unless the weight is interleaved and its kernel measured faster (:func:`_prefill_gemm`).
    Without bf16 GEMM, the 32-input formats from :data:`F32_MIN_ROWS_32` rows: :func:`slab_matmul`
    in float32 (:func:`_float32_prefill`)."""
    if x2d.dim() != 2 or x2d.shape[1] != weight.in_features:
        raise ValueError(f"x is {tuple(x2d.shape)}, expected [m, {weight.in_features}]")
    if x2d.shape[0] >= dequant_min_rows(weight.ggml_type) and _prefill_gemm(weight):
        return slab_matmul(x2d, weight, torch.bfloat16)
    if x2d.shape[0] >= F32_MIN_ROWS_32 and _float32_prefill(weight):
        return slab_matmul(x2d, weight, torch.float32)
    return gguf_native.matmul(x2d, weight.ggml_type, weight.data, weight.in_features, interleaved=weight.interleaved)


def _prefill_gemm(weight: BlockWeight) -> bool:
    """Whether a prefill-sized call dequantizes and runs the bf16 GEMM. An interleaved weight
    keeps its kernel unless the GEMM measured faster for its format."""
    if not _fast_bf16_gemm():
        return False
    if weight.interleaved:
        return _x16_gemm_wins(weight.ggml_type)
    return True


def _float32_prefill(weight: BlockWeight) -> bool:
    """Whether a prefill-sized call (:data:`F32_MIN_ROWS_32` rows and more) dequantizes to float32
    and runs torch's float32 GEMM: a 32-input format, not interleaved, on a CPU without bf16 GEMM."""
    return not weight.interleaved and weight.ggml_type not in gguf_native.K_FORMATS and not _fast_bf16_gemm()


def dequant_min_rows(ggml_type: GGMLQuantizationType) -> int:
    """From how many rows a call takes the dequantize + GEMM path (where bf16 GEMM exists)."""
    return DEQUANT_MIN_ROWS_K if ggml_type in gguf_native.K_FORMATS else DEQUANT_MIN_ROWS_32


def slab_matmul(x2d: torch.Tensor, weight: BlockWeight, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``x2d @ W.T`` -> float32, W dequantized natively to ``dtype`` (bf16: the weights and
    activations rounded to bf16, as the unquantized model's prefill multiplies; float32) a slab
    of rows at a time (bounded peak), multiplied by torch's GEMM."""
    x = x2d.to(dtype)
    out = torch.empty(x.shape[0], weight.out_features, dtype=torch.float32)
    for start in range(0, weight.out_features, _SLAB_ROWS):
        stop = min(start + _SLAB_ROWS, weight.out_features)
        rows = gguf_native.dequantize(weight.ggml_type, weight.data[start:stop], weight.in_features, dtype=dtype,
                                      interleaved=weight.interleaved)
        out[:, start:stop] = x @ rows.T
    return out


def decide_prefill_paths(weights: Iterable[BlockWeight]) -> None:
    """Run the prefill probe of each interleaved format among ``weights`` now (at load), so that
    a worker's first prompt does not wait for them."""
    if _fast_bf16_gemm():
        for ggml_type in {w.ggml_type for w in weights if w.interleaved}:
            _x16_gemm_wins(ggml_type)


@functools.lru_cache(maxsize=None)
def _x16_gemm_wins(ggml_type: GGMLQuantizationType) -> bool:
    """Whether the bf16 GEMM beats the interleaved kernel of ``ggml_type`` at prefill sizes on
    this CPU (measured once per process and format, :mod:`engine.quant.prefill_choice`)."""
    rng = np.random.default_rng(0)
    weight = random_blocks(ggml_type, X16_PROBE_OUT, X16_PROBE_IN, rng).interleave()
    x = torch.from_numpy(rng.standard_normal((prefill_choice.PROBE_ROWS, X16_PROBE_IN), dtype=np.float32))
    x = x.to(torch.bfloat16)
    return prefill_choice.choose(
        lambda: gguf_native.matmul(x, weight.ggml_type, weight.data, weight.in_features, interleaved=True),
        lambda: slab_matmul(x, weight, torch.bfloat16), weights="gguf", format=ggml_type.name)


@functools.lru_cache(maxsize=1)
def _fast_bf16_gemm() -> bool:
    """Whether this CPU's oneDNN has bf16 GEMM kernels (AVX512-BF16 / AMX)."""
    return packing_available(torch.bfloat16, torch.device("cpu"))
