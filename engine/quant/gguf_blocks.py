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
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from engine.packed import packing_available
from engine.quant import gguf_native

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
# equal at 64; Q8_0 ahead from 64 rows). A float32 GEMM was at best even with the integer kernels
# up to 512 rows, so CPUs without bf16 GEMM keep the integer kernels. ``python -m
# bench.gguf_kernels`` measures the crossing per format (results/gguf_kernels.json).
DEQUANT_MIN_ROWS_K, DEQUANT_MIN_ROWS_32 = 128, 64


@dataclass(eq=False)
class BlockWeight:
    """One matrix in a GGUF block format: ``data`` is uint8 ``[out_features, row_bytes]``."""

    ggml_type: GGMLQuantizationType
    out_features: int
    in_features: int
    data: torch.Tensor

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

    def rows(self, start: int, stop: int) -> "BlockWeight":
        """Rows ``start:stop`` (a view: blocks never cross rows)."""
        return BlockWeight(self.ggml_type, stop - start, self.in_features, self.data[start:stop])


def dequantize_rows(weight: BlockWeight, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Rows ``start:stop`` of the weight in float32, by gguf-py's own dequantization (the reference)."""
    stop = weight.out_features if stop is None else stop
    raw = weight.data[start:stop].numpy()
    values = gguf_dequantize(np.ascontiguousarray(raw), weight.ggml_type)
    return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(stop - start, weight.in_features))


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
    with bf16 GEMM: :func:`slab_matmul` in bf16, faster there (``python -m bench.gguf_kernels``)."""
    if x2d.dim() != 2 or x2d.shape[1] != weight.in_features:
        raise ValueError(f"x is {tuple(x2d.shape)}, expected [m, {weight.in_features}]")
    if x2d.shape[0] >= dequant_min_rows(weight.ggml_type) and _fast_bf16_gemm():
        return slab_matmul(x2d, weight, torch.bfloat16)
    return gguf_native.matmul(x2d, weight.ggml_type, weight.data, weight.in_features)


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
        rows = gguf_native.dequantize(weight.ggml_type, weight.data[start:stop], weight.in_features, dtype=dtype)
        out[:, start:stop] = x @ rows.T
    return out


@functools.lru_cache(maxsize=1)
def _fast_bf16_gemm() -> bool:
    """Whether this CPU's oneDNN has bf16 GEMM kernels (AVX512-BF16 / AMX)."""
    return packing_available(torch.bfloat16, torch.device("cpu"))
