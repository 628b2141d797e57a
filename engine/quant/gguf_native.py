"""GGUF block formats run by our C kernels (``native/gguf.c``), bound with ctypes.

The weights are read as the file stores them: :class:`~engine.quant.gguf_blocks.BlockWeight`
rows of ggml blocks (Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q8_0), any uint8 tensor whose rows are
contiguous (a view of the mapped file; the row stride is passed through). One exception, on
AVX512-VNNI CPUs, Q4_K, Q6_K, Q5_0 and Q8_0 matrices whose rows come in whole groups of 16 are
*interleaved* once at load (:func:`repack_x16`, the same bytes in new places: a 64-byte load then
holds 4 codes of each of 16 rows, so the kernel works on 16 rows per instruction instead of
unpacking each row's scales or reducing each row's lanes; Q4_K's needed about half the
instructions per byte, ``gguf.c``'s ``dot_*_x16``); on AVX2 CPUs, Q5_0 and Q4_K matrices (read
as two 8-row halves; the other formats' row kernels were as fast there, :data:`INTERLEAVED_BY_PATH`).

Activations are quantized once per call, per block, to int8 (the numbers the tests reproduce):
per block of 256 inputs (K formats) or 32 inputs (the others), ``d = amax / 127`` and
``q = round_half_even(x * (127 / amax))`` clamped to -127..127, both computed in float32 (bf16
inputs are widened first; an all-zero block has d = 0). Each output is then, per block,
``d_w * d_x * (integer dot of the codes)`` plus the format's minimum / offset term through the
activation codes' sums, summed in float32. Against float32 over the unquantized activations the
difference is the activation rounding: at most half a step (``d / 2``) per input.
"""
from __future__ import annotations

import ctypes
import functools

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.quant import native

_PATHS = {2: "avx512-vnni", 1: "avx2", 0: "portable"}
_ERRORS = {1: "unsupported type or inputs not whole blocks", 2: "out of memory", 3: "row id out of range"}
TYPES = frozenset({GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K,
                    GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0,
                    GGMLQuantizationType.Q8_0})
K_FORMATS = frozenset({GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K})
# gguf.c's T_*_X16: rows interleaved by 16 (not ggml types: ggml's id + 100)
X16_KERNEL_TYPES = {t: int(t) + 100 for t in (GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q8_0,
                                              GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K)}
X16_ROWS = 16
# Which interleaved layouts each vector path has kernels for (gguf.c's dot_*_x16). On AVX2: Q5_0
# (its row kernel spends most of its instructions once per 32-input block; one row 1.6x, 4 rows
# 2.3x) and Q4_K (its row kernel was bound by its arithmetic at about 24 GB/s; interleaved, a
# sub-block's 8 rows add their pair sums in 16 bits and it reads at memory speed). Interleaved
# Q6_K and Q8_0 lost or only traded memory for batch 8 there. (Q6_K again with its pair sums
# added in 16 bits two by two, as Q4_K's: 1.28x the row kernel from cache, 0.80-0.95x from
# memory at one row, where a loop that only loads the same layout was 1.15x; kept as stored.)
INTERLEAVED_BY_PATH = {"avx512-vnni": frozenset(X16_KERNEL_TYPES),
                       "avx2": frozenset({GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q4_K}),
                       "portable": frozenset()}


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    lib = native.library()
    ptr, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ms_gguf_matmul.restype = c_int
    lib.ms_gguf_matmul.argtypes = [c_int, ptr, c_int, i64, i64, ptr, i64, i64, ptr, i64, c_int]
    lib.ms_gguf_dequant.restype = c_int
    lib.ms_gguf_dequant.argtypes = [c_int, ptr, i64, i64, i64, ptr, i64, ptr, i64, c_int, c_int]
    lib.ms_gguf_row_bytes.restype, lib.ms_gguf_row_bytes.argtypes = i64, [c_int, i64]
    lib.ms_gguf_simd.restype = c_int
    lib.ms_gguf_repack_x16.restype = c_int
    lib.ms_gguf_repack_x16.argtypes = [c_int, ptr, i64, i64, i64, ptr, c_int]
    return lib


def vector_path() -> str:
    """Which path this build of gguf.c runs: ``avx512-vnni``, ``avx2`` or ``portable``."""
    return _PATHS[_lib().ms_gguf_simd()]


def interleaves(ggml_type: GGMLQuantizationType, rows: int) -> bool:
    """Whether a matrix of ``rows`` rows of ``ggml_type`` runs interleaved on this CPU."""
    return ggml_type in INTERLEAVED_BY_PATH[vector_path()] and rows % X16_ROWS == 0


def repack_x16(data: torch.Tensor, ggml_type: GGMLQuantizationType, in_features: int, threads: int = 0,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``data`` of one of :data:`X16_KERNEL_TYPES` (a multiple of 16 of them) interleaved by
    16: a contiguous tensor of the same shape and bytes (``out`` when given), read by the kernels
    with ``interleaved=True``."""
    _check(data, ggml_type, in_features)
    _kernel_type(ggml_type, data, interleaved=True)
    if out is None:
        out = torch.empty(data.shape, dtype=torch.uint8)
    elif out.shape != data.shape or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous uint8 {tuple(data.shape)}")
    status = _lib().ms_gguf_repack_x16(int(ggml_type), data.data_ptr(), data.stride(0), data.shape[0], in_features,
                                       out.data_ptr(), threads or torch.get_num_threads())
    _raise(status, f"{ggml_type.name} interleaving")
    return out


def kernel_type(ggml_type: GGMLQuantizationType, interleaved: bool) -> int:
    """The type id gguf.c reads a matrix as: ggml's, or its interleaved layout's."""
    return X16_KERNEL_TYPES[ggml_type] if interleaved else int(ggml_type)


def _kernel_type(ggml_type: GGMLQuantizationType, data: torch.Tensor, interleaved: bool) -> int:
    if interleaved and (ggml_type not in X16_KERNEL_TYPES or data.shape[0] % X16_ROWS):
        raise ValueError(f"only {', '.join(t.name for t in X16_KERNEL_TYPES)} in whole groups of {X16_ROWS} rows "
                         "are interleaved")
    return kernel_type(ggml_type, interleaved)


def _check(data: torch.Tensor, ggml_type: GGMLQuantizationType, in_features: int) -> None:
    """Refuse what the C code would read out of bounds: a wrong row size, strided bytes."""
    if ggml_type not in TYPES:
        raise ValueError(f"no block kernel for {ggml_type.name}")
    if data.dtype != torch.uint8 or data.dim() != 2 or (data.shape[0] > 1 and data.stride(1) != 1):
        raise ValueError("block weight data must be uint8 [rows, row_bytes] with contiguous rows")
    elems, nbytes = GGML_QUANT_SIZES[ggml_type]
    if in_features % elems or data.shape[1] != in_features // elems * nbytes:
        raise ValueError(f"{ggml_type.name} rows of {data.shape[1]} bytes do not hold {in_features} inputs")
    if data.device.type != "cpu":
        raise ValueError("block weights live on the CPU")


def _raise(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"{what} failed: {_ERRORS.get(status, f'status {status}')}")


def matmul(x2d: torch.Tensor, ggml_type: GGMLQuantizationType, data: torch.Tensor, in_features: int,
           threads: int = 0, interleaved: bool = False) -> torch.Tensor:
    """``x2d [m, in_features] @ W.T`` -> float32 ``[m, rows]`` with W = ``data``'s rows of
    ``ggml_type`` blocks (activations quantized per block, module docstring). ``threads`` 0:
    torch's intra-op thread count. ``interleaved``: ``data`` is :func:`repack_x16`'s."""
    _check(data, ggml_type, in_features)
    kernel_type = _kernel_type(ggml_type, data, interleaved)
    if x2d.dim() != 2 or x2d.shape[1] != in_features:
        raise ValueError(f"x is {tuple(x2d.shape)}, expected [m, {in_features}]")
    x = x2d if x2d.dtype in (torch.float32, torch.bfloat16) else x2d.float()
    x = x.contiguous()
    m, n = x.shape[0], data.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    if m == 0 or n == 0:
        return out
    status = _lib().ms_gguf_matmul(kernel_type, x.data_ptr(), int(x.dtype == torch.bfloat16), m, in_features,
                                   data.data_ptr(), data.stride(0), n, out.data_ptr(), n,
                                   threads or torch.get_num_threads())
    _raise(status, f"{ggml_type.name} block matmul (m={m}, k={in_features}, n={n})")
    return out


def dequantize(ggml_type: GGMLQuantizationType, data: torch.Tensor, in_features: int,
               ids: torch.Tensor | None = None, dtype: torch.dtype = torch.float32, threads: int = 0,
               interleaved: bool = False) -> torch.Tensor:
    """Rows of W in ``dtype`` (float32 or bf16): all of ``data``'s rows, or rows ``ids`` (any
    shape: the result is ``[*ids.shape, in_features]``, an embedding lookup)."""
    _check(data, ggml_type, in_features)
    kernel_type = _kernel_type(ggml_type, data, interleaved)
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dequantize gives float32 or bf16, not {dtype}")
    flat = None if ids is None else ids.reshape(-1).to(torch.int64).contiguous()
    n = data.shape[0] if flat is None else flat.numel()
    out = torch.empty(n, in_features, dtype=dtype)
    if n:
        status = _lib().ms_gguf_dequant(kernel_type, data.data_ptr(), data.stride(0), data.shape[0], in_features,
                                        None if flat is None else flat.data_ptr(), n, out.data_ptr(), in_features,
                                        int(dtype == torch.bfloat16), threads or torch.get_num_threads())
        if status == 3:
            raise IndexError(f"row id out of range for a table of {data.shape[0]} rows")
        _raise(status, f"{ggml_type.name} dequantization")
    return out if ids is None else out.reshape(*ids.shape, in_features)
