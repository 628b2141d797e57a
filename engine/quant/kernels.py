"""Packing and matmul kernels for weight-only int8 / int4 on CPU (torch's own aten ops).

What torch 2.13 (CPU build) offers, measured on this machine (docs/quantization.md):
- ``aten._weight_int8pack_mm(x, w_int8[N, K], scales[N])``: int8 per output channel. Fast
  with bfloat16 activations (scales must share the activation dtype); float32 activations
  take a slow path (~30x slower), so we always run it in bfloat16. K must be a multiple of
  16 (else wrong results or a segfault), so other K are zero-padded.
- ``aten._convert_weight_to_int4pack_for_cpu(q_int32[N, K], 1)`` +
  ``aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros[K/group, N, 2])``:
  int4 per group, dequantizing ``w = (q - 8) * scale + zero``. Needs N % 16 == 0 and a group
  size of 32, 64, 128 or 256 that divides K.
- ``aten._dyn_quant_matmul_4bit`` (KleidiAI) is Arm-only: on x86 its "packed" weight is the
  float32 dequantized matrix, so it saves nothing; not used.
- torchao 0.18 installs offline and runs on torch 2.13 CPU, but its weight-only configs end
  in the same aten kernels; not a dependency.

Both kernels take 2-D activations only, so callers flatten leading dimensions.
"""
from __future__ import annotations

import functools

import torch

KERNEL_DTYPE = torch.bfloat16  # activation/scale dtype the packed kernels are fast in
INT4_GROUP_SIZES = (256, 128, 64, 32)  # what _weight_int4pack_mm_for_cpu accepts
INT4_N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu wants N divisible by this
# _weight_int8pack_mm gives wrong results, or crashes the process, when K is not a multiple
# of 16 (seen with K = 8, 24, 72, 136 in torch 2.13): such weights are zero-padded in K.
INT8_K_MULTIPLE = 16


class QuantKernelError(RuntimeError):
    """The quantized matmul kernel a setting needs is missing or broken in this torch build."""


def _to_bf16_up(values: torch.Tensor) -> torch.Tensor:
    """Round positive float32 values *up* to bfloat16, so a scale never shrinks the range."""
    rounded = values.to(KERNEL_DTYPE)
    low = rounded.float() < values
    if bool(low.any()):
        bumped = torch.nextafter(rounded, torch.full_like(rounded, float("inf")))
        rounded = torch.where(low, bumped, rounded)
    return rounded


# -- int8, per output channel ------------------------------------------------------------
def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (q[N, K] int8, scales[N] bf16) with w ~= q * scale.

    The scale is rounded to bfloat16 (the kernel's scale dtype) *before* rounding the
    weights, so the stored pair is exactly what the kernel multiplies."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1).clamp(min=1e-8)
    scales = _to_bf16_up(amax / 127.0)
    q = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scales.contiguous()


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return q.float() * scales.float()[:, None]


def int8_mm(x2d: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int8pack_mm(x2d, q, scales)


# -- int4, per group (asymmetric) ---------------------------------------------------------
def int4_group_size(in_features: int, preferred: int) -> int | None:
    """The largest accepted group size <= ``preferred`` that divides K, or None."""
    for size in INT4_GROUP_SIZES:
        if size <= preferred and in_features % size == 0:
            return size
    return None


def quantize_int4(weight: torch.Tensor, group_size: int,
                  levels: tuple[int, ...] = (15,)) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per group of ``group_size`` inputs.

    Returns (q[N, K] int32 in 0..15, scales_and_zeros[K/group, N, 2] bf16) in the layout the
    CPU kernel reads: w = (q - 8) * scale + zero. Scale and zero are rounded to bfloat16 first
    and the weights rounded against those stored values. For each group the step is
    (max - min) / L for the L in ``levels`` with the least squared error: L = 15 is plain
    min/max; smaller L finds the grid of weights that are already 4-bit-quantized with
    fewer levels used (the default model's Q4_K tensors) and recovers them exactly."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group_size, group_size)
    low = w.amin(dim=-1)
    high = w.amax(dim=-1)
    best = None
    for count in levels:
        scales = _to_bf16_up(((high - low) / count).clamp(min=1e-8))
        zeros = (low + 8.0 * scales.float()).to(KERNEL_DTYPE)
        s, z = scales.float()[..., None], zeros.float()[..., None]
        q = (torch.round((w - z) / s) + 8.0).clamp(0, 15)
        if len(levels) == 1:
            best = (q, scales, zeros)
            break
        err = ((q - 8.0) * s + z - w).pow(2).sum(dim=-1)
        if best is None:
            best = (q, scales, zeros, err)
            continue
        better = err < best[3]
        best = (torch.where(better[..., None], q, best[0]), torch.where(better, scales, best[1]),
                torch.where(better, zeros, best[2]), torch.minimum(err, best[3]))
    q, scales, zeros = best[0], best[1], best[2]
    packed_params = torch.stack([scales.T, zeros.T], dim=-1).contiguous()
    return q.to(torch.int32).reshape(n, k).contiguous(), packed_params


def dequantize_int4(q: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    n, k = q.shape
    scales = scales_and_zeros[..., 0].T.float()[..., None]  # [N, K/group, 1]
    zeros = scales_and_zeros[..., 1].T.float()[..., None]
    w = (q.float().reshape(n, k // group_size, group_size) - 8.0) * scales + zeros
    return w.reshape(n, k)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)


def int4_mm(x2d: torch.Tensor, packed: torch.Tensor, group_size: int,
            scales_and_zeros: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x2d, packed, group_size, scales_and_zeros)


# -- availability -------------------------------------------------------------------------
_KERNEL_NAMES = {
    "q8": (),   # our own C kernel (engine.quant.native), checked by _check_q8
    "int8": ("_weight_int8pack_mm",),
    "int4": ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu"),
}


@functools.lru_cache(maxsize=None)
def check_kernels(mode: str, device: str = "cpu") -> None:
    """Run the mode's kernel once on a small matrix against a dequantized matmul.

    Raises :class:`QuantKernelError` naming the missing op and the torch version, so a
    worker refuses to start instead of failing on the first request."""
    if mode not in _KERNEL_NAMES:
        raise QuantKernelError(f"unknown quantization mode {mode!r}; expected int8 or int4")
    if device != "cpu":
        raise QuantKernelError(f"MINISERVE_QUANT={mode} runs on CPU only (got device {device}); "
                               "use MINISERVE_QUANT=none on this device")
    if mode == "q8":
        _check_q8()
        return
    for name in _KERNEL_NAMES[mode]:
        if not hasattr(torch.ops.aten, name):
            raise QuantKernelError(f"MINISERVE_QUANT={mode} needs torch.ops.aten.{name}, which this "
                                   f"torch {torch.__version__} does not provide (torch >= 2.6 CPU)")
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(32, 64, generator=gen)
    x = torch.randn(2, 64, generator=gen).to(KERNEL_DTYPE)
    try:
        if mode == "int8":
            q, scales = quantize_int8(weight)
            got = int8_mm(x, q, scales)
            want = x.float() @ dequantize_int8(q, scales).T
        else:
            q, params = quantize_int4(weight, 32)
            got = int4_mm(x, pack_int4(q), 32, params)
            want = x.float() @ dequantize_int4(q, params, 32).T
    except RuntimeError as exc:
        raise QuantKernelError(f"MINISERVE_QUANT={mode}: the CPU kernel failed in this torch "
                               f"{torch.__version__}: {exc}") from exc
    if not torch.allclose(got.float(), want, rtol=2e-2, atol=5e-2):
        raise QuantKernelError(f"MINISERVE_QUANT={mode}: the CPU kernel gives wrong results in "
                               f"torch {torch.__version__} (max error "
                               f"{(got.float() - want).abs().max().item():.3g})")


def _check_q8() -> None:
    """Build (or find) our C kernel, insist on a vector path (AVX512-VNNI or AVX2: the portable
    C loop is correct but slower than bf16, and running it silently would be slow code nobody
    chose), and compare it with the dequantized matmul."""
    from engine.quant import native, q8

    try:
        path = native.vector_path()
    except native.NativeBuildError as exc:
        raise QuantKernelError(f"MINISERVE_QUANT=q8 needs our C kernel: {exc}") from exc
    if path == "portable":
        raise QuantKernelError("MINISERVE_QUANT=q8 needs a CPU with AVX2 (with FMA and F16C) or "
                               "AVX512-VNNI (avx2 / avx512_vnni in /proc/cpuinfo); this one has "
                               "only the portable, slow kernel")
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 96, generator=gen)
    x = torch.randn(3, 96, generator=gen)
    codes, scales = q8.quantize(weight)
    got = q8.linear(x, codes, scales, None)
    want = x @ q8.dequantize(codes, scales).T
    if not torch.allclose(got, want, rtol=5e-2, atol=5e-2):
        raise QuantKernelError(f"MINISERVE_QUANT=q8: our C kernel gives wrong results on this CPU "
                               f"(max error {(got - want).abs().max().item():.3g})")
