"""Start-up check of the q8 kernel (our C kernel, :mod:`engine.quant.q8`).

Why a check at load: a worker whose kernel is missing (no C compiler) or slow (no vector path)
should refuse to start with a message naming the cause, not fail or crawl on its first request.
"""
from __future__ import annotations

import functools

import torch

from engine.quant import native, q8


class QuantKernelError(RuntimeError):
    """The quantized matmul kernel a setting needs is missing or broken on this machine."""


@functools.lru_cache(maxsize=None)
def check_kernels(mode: str, device: str = "cpu") -> None:
    """Run the mode's kernel once on a small matrix against a dequantized matmul.

    Raises :class:`QuantKernelError` naming the cause, so a worker refuses to start instead of
    failing on the first request."""
    if mode != "q8":
        raise QuantKernelError(f"unknown quantization mode {mode!r}; expected q8")
    if device != "cpu":
        raise QuantKernelError(f"MINISERVE_QUANT={mode} runs on CPU only (got device {device}); "
                               "use MINISERVE_QUANT=none on this device")
    _check_q8()


def _check_q8() -> None:
    """Build (or find) our C kernel, insist on a vector path (AVX512-VNNI or AVX2: the portable
    C loop is correct but slower than bf16, and running it silently would be slow code nobody
    chose), and compare it with the dequantized matmul."""
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
