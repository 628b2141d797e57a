"""``q8``: int8 weights with one fp16 scale per group of 32 inputs, run by our C kernel.

The numbers are llama.cpp's Q8_0: per group, ``scale = amax / 127`` rounded to fp16 (up, so
no weight leaves the range) and ``c = round(w / scale)``. Groups of 32 keep every weight within
half a step of its own group's range, where per-row int8 (``int8``) shares one scale among
896-4864 inputs; the default model's GGUF stores most tensors as Q5_0 or Q8_0 in groups of 32,
whose values this format holds exactly. The kernel (:mod:`engine.quant.native`, ``q8.c``)
quantizes the activations the same way and multiplies in integers (AVX512-VNNI's vpdpbusd,
or AVX2's vpmaddwd on widened codes where the CPU has no AVX-512).

Storage: ``codes`` uint8 ``[N, K]`` holding ``c + 128`` (the kernel's unsigned operand) in the
kernel's interleaved order (:func:`interleave`), ``scales`` fp16 ``[N, K / 32]``; K is
zero-padded to a multiple of 32.
"""
from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F

from engine.packed import packing_available
from engine.quant import native, prefill_choice

GROUP = 32
MODES = ("q8", "q5")  # QuantizedLinear storage modes run by this kernel (q5: pack5'ed q8 codes)
OFFSET = 128
Q5_OFFSET = 16      # pack5: codes stored as c + 16 in 5 bits
Q5_CHUNK_BYTES = 40 # pack5: 64 positions per chunk (nibbles + fifth bits)
BLOCK_GROUPS = 16   # groups per interleaved block (q8.c)
LEVELS = (127, 16)  # candidate steps amax / L per group (quantize)
# Activations go in as two bytes (about 16 bits: the kernel adds almost no error beyond the
# weights') except in a batched decode step of more than this many rows (:func:`batched_decode`),
# where compute, not reading the weights, is the bound and one byte (8 bits) halves the
# multiplies. Prefill stays precise: the prompt's K/V is reused by every later token, and
# 8-bit prefill cost free-running agreement with bf16 (0.896 against 0.946, docs/quantization.md).
PRECISE_MAX_ROWS = 4
# Calls of at least this many bf16 rows outside a batched decode step (prefill) unpack the
# weights to bf16 once and run oneDNN's GEMM where it is faster than the integer kernel, which
# is compute-bound there (two multiplies per byte); the unpacked values are the weights rounded
# to bf16, i.e. the same arithmetic as `none`'s prefill. Break-even near 64 rows on an AMD EPYC
# (bench.quantization --kernels, results/quant_kernels.csv: q8 at 64 and 280 rows against the
# bf16 GEMMs); on an Intel Xeon the kernel stayed faster, so the choice is measured once per
# process (engine.quant.prefill_choice).
DEQUANT_MIN_ROWS = 64
# Without bf16 GEMM kernels (AVX2 CPUs: oneDNN has none, and torch's bf16 matmul there ran 3-5x
# slower than float32) the integer kernel keeps prefill up to this many rows (64 rows of a
# gate_up: 18 ms, against 64 ms through bf16); longer calls unpack to float32 for its GEMM
# (280 rows: 65 ms against 95 ms in the integer kernel; one-off timings on a 2-core Zen 3).
DEQUANT_F32_MIN_ROWS = 256
_state = threading.local()


@contextmanager
def batched_decode() -> Iterator[None]:
    """Calls inside (on this thread) with more than :data:`PRECISE_MAX_ROWS` rows use one-byte
    activations: the paged scheduler wraps its decode-only steps in it."""
    before = getattr(_state, "batched_decode", False)
    _state.batched_decode = True
    try:
        yield
    finally:
        _state.batched_decode = before


# Vector paths on which a Q5_0 tensor is kept in 5 bits (pack5). With AVX512-VNNI unpacking costs
# 3 instructions per 64 weights and the kernel stays bound by reading them: 5 bits read faster.
# With AVX2 (no byte masks, vpmaddwd on widened codes) it costs ~30 instructions per 64 and the
# 5-bit kernel is compute-bound: slower than reading the codes as q8 (``python -m
# bench.quantization --kernels`` times both, modes q8 and q5).
FIVE_BIT_PATHS = ("avx512-vnni",)


def packs_five_bits() -> bool:
    """Whether :func:`engine.quant.layer.quantize_linear` stores Q5_0 grids in 5 bits here."""
    return native.vector_path() in FIVE_BIT_PATHS


def pad_inputs(k: int) -> int:
    return (-k) % GROUP


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K'], scales fp16 [N, K'/32]) with K' = K padded to a multiple of 32.

    Per group the step is ``amax / L`` for the L in :data:`LEVELS` with the least squared
    error: L = 127 is plain Q8_0; L = 16 finds the grid of a group already stored as Q5_0
    (``d * (u - 16)``, its largest weight at 16 steps) and keeps it exactly."""
    w = weight.detach().float()
    if pad_inputs(w.shape[1]):
        w = F.pad(w, (0, pad_inputs(w.shape[1])))
    n, k = w.shape
    groups = w.reshape(n, k // GROUP, GROUP)
    amax = groups.abs().amax(dim=-1)
    best_codes, best_scales, best_err = None, None, None
    for levels in LEVELS:
        scales = _fp16_up(amax / levels)
        safe = torch.where(scales.float() > 0, scales.float(), torch.ones_like(scales.float()))
        codes = torch.round(groups / safe[..., None]).clamp(-127, 127)
        err = (codes * scales.float()[..., None] - groups).pow(2).sum(dim=-1)
        if best_err is None:
            best_codes, best_scales, best_err = codes, scales, err
            continue
        better = err < best_err
        best_codes = torch.where(better[..., None], codes, best_codes)
        best_scales = torch.where(better, scales, best_scales)
        best_err = torch.minimum(err, best_err)
    # A Q5_0 group whose extreme weight is positive comes out as codes -15..16: flip its sign
    # (scale and codes) to -16..15, so that it fits 5 bits (pack5). The values do not change.
    flip = (best_codes.amax(dim=-1) == Q5_OFFSET) & (best_codes.amin(dim=-1) > -Q5_OFFSET)
    best_codes = torch.where(flip[..., None], -best_codes, best_codes)
    best_scales = torch.where(flip, -best_scales, best_scales)
    codes = (best_codes + OFFSET).to(torch.uint8).reshape(n, k)
    return interleave(codes), best_scales.contiguous()


def dequantize(codes: torch.Tensor, scales: torch.Tensor, in_features: int | None = None) -> torch.Tensor:
    n, k = codes.shape
    plain = deinterleave(codes)
    w = (plain.float() - OFFSET).reshape(n, k // GROUP, GROUP) * scales.float()[..., None]
    return w.reshape(n, k)[:, : in_features or k]


def _blocks(k: int) -> list[tuple[int, int]]:
    """(first input, groups) of each interleaved block of a row of ``k`` inputs."""
    groups = k // GROUP
    return [(start * GROUP, min(BLOCK_GROUPS, groups - start)) for start in range(0, groups, BLOCK_GROUPS)]


def interleave(plain: torch.Tensor) -> torch.Tensor:
    """[N, K] in input order -> the kernel's order: per block of up to 16 groups, the bytes
    ``[chunk j = 0..7][group][4]`` (chunk j: bytes 4j..4j+3 of every group of the block)."""
    n, k = plain.shape
    parts = [plain[:, a:a + g * GROUP].reshape(n, g, 8, 4).transpose(1, 2).reshape(n, g * GROUP)
             for a, g in _blocks(k)]
    return torch.cat(parts, dim=1).contiguous()


def deinterleave(codes: torch.Tensor) -> torch.Tensor:
    n, k = codes.shape
    parts = [codes[:, a:a + g * GROUP].reshape(n, 8, g, 4).transpose(1, 2).reshape(n, g * GROUP)
             for a, g in _blocks(k)]
    return torch.cat(parts, dim=1).contiguous()


def pack5(codes: torch.Tensor) -> torch.Tensor | None:
    """q8 codes whose values all lie in -16..15 (a Q5_0 tensor), packed in 5 bits per weight
    (q8.c's q5 layout: each chunk of a block padded to 64 positions, 32 bytes of nibbles then 8
    bytes of fifth bits); None when some code does not fit (the tensor stays q8)."""
    n, k = codes.shape
    signed = codes.to(torch.int16) - OFFSET
    if int(signed.min()) < -Q5_OFFSET or int(signed.max()) >= Q5_OFFSET:
        return None
    u = (signed + Q5_OFFSET).to(torch.uint8)
    parts = []
    for a, g in _blocks(k):
        chunks = F.pad(u[:, a:a + g * GROUP].reshape(n, 8, 4 * g), (0, 64 - 4 * g))
        nibbles = (chunks[..., :32] & 15) | ((chunks[..., 32:] & 15) << 4)
        bits = ((chunks >> 4) & 1).reshape(n, 8, 8, 8).to(torch.int32)
        fifth = (bits << torch.arange(8, dtype=torch.int32)).sum(-1).to(torch.uint8)
        parts.append(torch.cat([nibbles, fifth], dim=-1).reshape(n, -1))
    return torch.cat(parts, dim=1).contiguous()


def unpack5(packed: torch.Tensor, k: int) -> torch.Tensor:
    """The q8 codes (interleaved, ``c + 128``) of a :func:`pack5` result."""
    n = packed.shape[0]
    parts = []
    for index, (_, g) in enumerate(_blocks(k)):
        block = packed[:, index * 8 * Q5_CHUNK_BYTES:(index + 1) * 8 * Q5_CHUNK_BYTES].reshape(n, 8, Q5_CHUNK_BYTES)
        nibbles, fifth = block[..., :32], block[..., 32:]
        low = torch.cat([nibbles & 15, nibbles >> 4], dim=-1)
        bits = ((fifth[..., None].to(torch.int32) >> torch.arange(8, dtype=torch.int32)) & 1).reshape(n, 8, 64)
        u = (low.to(torch.int16) | (bits.to(torch.int16) << 4))[..., : 4 * g]
        parts.append((u - Q5_OFFSET + OFFSET).to(torch.uint8).reshape(n, -1))
    return torch.cat(parts, dim=1).contiguous()


def dequantize_bf16(codes: torch.Tensor, scales: torch.Tensor, packed5: bool = False,
                    threads: int = 0) -> torch.Tensor:
    """The weight as bf16 ``[N, K]`` (K padded to 32), unpacked by the C library (threaded)."""
    n, k = codes.shape[0], scales.shape[1] * GROUP
    out = torch.empty(n, k, dtype=torch.bfloat16)
    status = native.library().ms_q8_dequant_bf16(codes.data_ptr(), int(packed5), scales.data_ptr(), n, k,
                                                 out.data_ptr(), threads or torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"q8 unpacking failed with status {status}")
    return out


def rows5(packed: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor, hidden: int,
          dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` of a :func:`pack5`'ed table with its fp16 ``scales``, dequantized:
    ``[*ids.shape, hidden]`` in ``dtype`` (bf16 or float32; others through float32)."""
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= packed.shape[0]):
        raise IndexError(f"token id out of range for a table of {packed.shape[0]} rows")
    kind = dtype if dtype in (torch.bfloat16, torch.float32) else torch.float32
    out = torch.empty(flat.numel(), hidden, dtype=kind)
    native.library().ms_q5_rows(packed.data_ptr(), scales.data_ptr(), scales.shape[1] * GROUP, hidden,
                                flat.data_ptr(), flat.numel(), out.data_ptr(), int(kind == torch.bfloat16))
    return out.reshape(*ids.shape, hidden).to(dtype)


def linear(x2d: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
           threads: int = 0, precise: bool | None = None, packed5: bool = False) -> torch.Tensor:
    """``x2d [M, K] @ W.T (+ bias)`` in ``x2d``'s dtype (bf16 or float32; others go through float32).
    ``bias`` must be float32 (or None). ``threads`` 0: torch's intra-op thread count.
    ``precise`` None: two-byte activations, except above :data:`PRECISE_MAX_ROWS` rows in
    :func:`batched_decode`.
    ``packed5``: ``codes`` is a :func:`pack5` result."""
    dtype = x2d.dtype
    x = x2d if dtype in (torch.bfloat16, torch.float32) else x2d.float()
    k = scales.shape[1] * GROUP
    if x.shape[1] != k:
        x = F.pad(x, (0, k - x.shape[1]))
    x = x.contiguous()
    m, n = x.shape[0], codes.shape[0]
    out = torch.empty(m, n, dtype=x.dtype)
    bf16 = int(x.dtype == torch.bfloat16)
    batched = getattr(_state, "batched_decode", False)
    if precise is None and x.dtype == torch.bfloat16 and m >= DEQUANT_MIN_ROWS and not batched:
        if _fast_bf16_gemm():
            if _bf16_gemm_wins():
                weight = dequantize_bf16(codes, scales, packed5, threads)
                return F.linear(x, weight, None if bias is None else bias.to(x.dtype)).to(dtype)
        elif m >= DEQUANT_F32_MIN_ROWS:
            weight = dequantize_bf16(codes, scales, packed5, threads).float()
            return F.linear(x.float(), weight, bias).to(dtype)
    if precise is None:
        precise = m <= PRECISE_MAX_ROWS or not batched
    two_bytes = precise
    kernel = native.library().ms_q5_linear if packed5 else native.library().ms_q8_linear
    status = kernel(
        x.data_ptr(), bf16, m, k, codes.data_ptr(), scales.data_ptr(), n,
        None if bias is None else bias.data_ptr(), out.data_ptr(), bf16, threads or torch.get_num_threads(),
        int(two_bytes))
    if status != 0:
        raise RuntimeError(f"q8 kernel failed with status {status} (M={m}, K={k}, N={n})")
    return out if out.dtype == dtype else out.to(dtype)


@functools.lru_cache(maxsize=1)
def _fast_bf16_gemm() -> bool:
    """Whether this CPU's oneDNN has bf16 GEMM kernels (AVX512-BF16 / AMX / AVX-NE-CONVERT)."""
    return packing_available(torch.bfloat16, torch.device("cpu"))


def decide_prefill_path() -> None:
    """Run the prefill probe now (at load) where a prefill may ask it, so that a worker's first
    prompt does not wait for it."""
    if _fast_bf16_gemm():
        _bf16_gemm_wins()


@functools.lru_cache(maxsize=1)
def _bf16_gemm_wins() -> bool:
    """Whether this CPU's bf16 GEMM beats the integer kernel at prefill sizes (measured once per
    process, :mod:`engine.quant.prefill_choice`; random weights: the speed does not depend on them)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(prefill_choice.PROBE_OUT, prefill_choice.PROBE_IN, generator=generator) * 0.02
    codes, scales = quantize(weight)
    x = torch.randn(prefill_choice.PROBE_ROWS, prefill_choice.PROBE_IN, generator=generator).to(torch.bfloat16)
    return prefill_choice.choose(lambda: linear(x, codes, scales, None, precise=True),
                                 lambda: F.linear(x, dequantize_bf16(codes, scales)))


def _fp16_up(values: torch.Tensor) -> torch.Tensor:
    """Round positive float32 values *up* to fp16, so a scale never shrinks the range."""
    rounded = values.to(torch.float16)
    low = rounded.float() < values
    if bool(low.any()):
        bumped = torch.nextafter(rounded, torch.full_like(rounded, float("inf")))
        rounded = torch.where(low, bumped, rounded)
    return rounded
