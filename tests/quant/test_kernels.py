"""Round-trip error bounds of the int8 / int4 quantizers, and the kernel self-check."""
from __future__ import annotations

import pytest
import torch

from engine.quant import QuantKernelError, check_kernels, quantize_linear
from engine.quant import kernels

SHAPES = [(64, 96), (48, 128), (400, 64), (160, 256)]


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    w[0, 0] = 0.9  # an outlier: per-row / per-group scales must contain it
    return w.to(torch.bfloat16).float()


@pytest.mark.parametrize("n,k", SHAPES)
def test_int8_round_trip_within_half_a_step_per_row(n, k):
    w = _weight(n, k)
    layer = quantize_linear(w, None, "int8")
    err = (layer.dequantize() - w).abs()
    step = w.abs().amax(dim=1) / 127.0
    # half a step, plus the scale's rounding up to bfloat16 (< 2**-8 relative)
    assert torch.all(err.amax(dim=1) <= step * 0.5 * (1 + 2**-7) + 1e-7)
    assert layer.qweight.dtype == torch.int8 and layer.qweight.shape == (n, k)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group", [32, 64])
def test_int4_round_trip_within_half_a_step_per_group(n, k, group):
    w = _weight(n, k)
    layer = quantize_linear(w, None, "int4", group_size=group, int4_levels=(15,))  # plain min/max
    group = kernels.int4_group_size(k, group)  # largest accepted group <= the request dividing K
    assert layer.mode == "int4" and layer.group_size == group
    err = (layer.dequantize() - w).abs().reshape(n, k // group, group).amax(dim=-1)
    wg = w.reshape(n, k // group, group)
    step = (wg.amax(-1) - wg.amin(-1)) / 15.0
    zero_rounding = (wg.amin(-1).abs() + 8 * step) * 2**-8  # zero point stored in bfloat16
    assert torch.all(err <= step * 0.5 * (1 + 2**-7) + zero_rounding + 1e-7)
    # and clearly coarser than int8 but far below the weights' spread
    assert err.max() < 0.2 * w.abs().max()


def test_int4_level_search_never_worse_and_recovers_a_coarser_grid():
    w = _weight(64, 128)
    plain = quantize_linear(w, None, "int4", group_size=32, int4_levels=(15,))
    searched = quantize_linear(w, None, "int4", group_size=32)  # default: 15..12 levels
    sse = lambda layer: (layer.dequantize() - w).pow(2).reshape(64, 4, 32).sum(-1)  # noqa: E731
    assert torch.all(sse(searched) <= sse(plain) * (1 + 1e-3) + 1e-10)
    # weights on a 13-level grid per group (as 4-bit weights that do not use all 16 codes)
    g = torch.randint(0, 14, (64, 4, 32)).float()
    g[..., 0], g[..., 1] = 0, 13  # every group spans the full 13 steps
    grid = (g * 0.0078125 - 0.05).reshape(64, 128)  # step and offset exact in bfloat16
    err_plain = (quantize_linear(grid, None, "int4", group_size=32, int4_levels=(15,)).dequantize() - grid)
    err_search = (quantize_linear(grid, None, "int4", group_size=32).dequantize() - grid)
    # exact up to the zero point stored in bfloat16 (<1% of a step), vs ~40% of a step plain
    assert err_plain.abs().max() > 0.3 * 0.0078125 and err_search.abs().max() < 0.01 * 0.0078125


def test_int4_packing_in_row_chunks_matches_whole(monkeypatch):
    # The CPU packing interleaves rows in blocks of 64, so chunks must be multiples of 64.
    w = _weight(176, 64)
    whole = quantize_linear(w, None, "int4", group_size=32)
    monkeypatch.setattr("engine.quant.layer._CHUNK_ROWS", 64)
    chunked = quantize_linear(w, None, "int4", group_size=32)
    assert torch.equal(whole.qweight, chunked.qweight)
    assert torch.equal(whole.params, chunked.params)


def test_int4_without_a_dividing_group_falls_back_to_int8():
    layer = quantize_linear(_weight(32, 136), None, "int4", group_size=64)
    assert layer.mode == "int8" and layer.group_size is None


def test_scale_rounding_never_shrinks_range():
    values = torch.tensor([1.0 + 2**-10, 3.0e-3, 0.1234567])
    up = kernels._to_bf16_up(values)
    assert up.dtype == torch.bfloat16 and torch.all(up.float() >= values)


def test_kernel_self_check_passes_and_rejects_bad_requests():
    check_kernels("int8")
    check_kernels("int4")
    with pytest.raises(QuantKernelError, match="CPU only"):
        check_kernels("int8", "cuda")
    with pytest.raises(QuantKernelError, match="unknown quantization mode"):
        check_kernels("int2")


def test_missing_kernel_gives_clear_error(monkeypatch):
    monkeypatch.setitem(kernels._KERNEL_NAMES, "int4", ("_no_such_int4_kernel",))
    check_kernels.cache_clear()
    try:
        with pytest.raises(QuantKernelError, match="_no_such_int4_kernel"):
            check_kernels("int4")
    finally:
        check_kernels.cache_clear()
