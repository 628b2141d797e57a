"""QuantizedLinear outputs against the full-precision layer, on both sides of max_rows."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.quant import quantize_linear

# Relative error of a whole layer's output (norm of difference / norm of reference) for
# Gaussian weights: int8 keeps ~0.5%, int4 with groups of 32-64 ~8%. Bounds leave room.
TOLERANCE = {"int8": 0.02, "int4": 0.12}


def _layer(n: int, k: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(dtype)
    b = (torch.randn(n, generator=gen) * 0.1).to(dtype)
    x = torch.randn(2, 5, k, generator=gen).to(dtype)
    return w, b, x


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_output_close_to_full_precision(mode, dtype):
    w, b, x = _layer(96, 128, dtype)
    layer = quantize_linear(w, b, mode, group_size=32, max_rows=16)
    y = layer(x)  # 10 rows: packed kernel
    assert y.shape == (2, 5, 96) and y.dtype == dtype
    assert _rel(y, F.linear(x.float(), w.float(), b.float())) < TOLERANCE[mode]
    # and matches the dequantized weight closely (only activation/output rounding left)
    exact = F.linear(x.float(), layer.dequantize(), b.float())
    assert _rel(y, exact) < 0.01


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_many_rows_use_the_reference_weight(mode):
    w, b, x = _layer(64, 64, torch.bfloat16)
    layer = quantize_linear(w, b, mode, group_size=32, max_rows=4)
    assert layer.reference.data_ptr() == w.data_ptr()  # shared, not copied
    assert torch.equal(layer(x), F.linear(x, w, b))  # 10 rows > 4: exactly the bf16 GEMM


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_many_rows_without_reference_slice_the_packed_kernel(mode):
    w, b, x = _layer(64, 64, torch.bfloat16)
    layer = quantize_linear(w, b, mode, group_size=32, keep_reference=False, max_rows=3)
    assert layer.reference is None
    sliced = layer(x)  # 10 rows in slices of 3
    layer.max_rows = 64
    whole = layer(x)
    assert torch.allclose(sliced.float(), whole.float(), atol=1e-2)


def test_int4_pads_output_features_to_sixteen():
    w, b, x = _layer(37, 64, torch.bfloat16)
    layer = quantize_linear(w, b, "int4", group_size=32)
    assert layer.qweight.shape[0] == 48
    y = layer(x)
    assert y.shape == (2, 5, 37)
    assert _rel(y, F.linear(x.float(), w.float(), b.float())) < TOLERANCE["int4"]


@pytest.mark.parametrize("k", [8, 24, 72, 136])
def test_int8_input_sizes_off_sixteen_are_padded(k):
    # the raw kernel returns garbage or segfaults for these K; the layer pads K to 16
    w, b, x = _layer(40, k, torch.bfloat16)
    layer = quantize_linear(w, b, "int8", max_rows=64)
    assert layer.qweight.shape == (40, k + (-k) % 16)
    assert layer.dequantize().shape == (40, k)
    assert _rel(layer(x), F.linear(x.float(), w.float(), b.float())) < TOLERANCE["int8"]


def test_int4_fallback_layer_runs():
    w, b, x = _layer(64, 136, torch.bfloat16)  # no int4 group divides 136: int8, padded
    layer = quantize_linear(w, b, "int4", max_rows=64)
    assert layer.mode == "int8"
    assert _rel(layer(x), F.linear(x.float(), w.float(), b.float())) < TOLERANCE["int8"]


def test_empty_input():
    w, b, _ = _layer(32, 64, torch.bfloat16)
    layer = quantize_linear(w, b, "int8")
    assert layer(torch.zeros(0, 64, dtype=torch.bfloat16)).shape == (0, 32)


def test_nbytes_counts_low_bit_storage():
    w, _, _ = _layer(256, 256, torch.bfloat16)
    int8 = quantize_linear(w, None, "int8").nbytes
    int4 = quantize_linear(w, None, "int4", group_size=64).nbytes
    assert int8 == 256 * 256 + 256 * 2
    assert int4 == 256 * 128 + (256 // 64) * 256 * 2 * 2
    assert int4 < int8 < w.numel() * 2


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="unknown quantization mode"):
        quantize_linear(torch.zeros(16, 32), None, "fp8")
