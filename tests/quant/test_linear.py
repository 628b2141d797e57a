"""QuantizedLinear (q8) outputs against the full-precision layer, at every row count."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.quant.layer import quantize_linear

# Relative error of a whole layer's output (norm of difference / norm of reference) for
# Gaussian weights: q8 (int8 in groups of 32) keeps well under 1%. The bound leaves room.
TOLERANCE = 0.02


def _layer(n: int, k: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(dtype)
    b = (torch.randn(n, generator=gen) * 0.1).to(dtype)
    x = torch.randn(2, 5, k, generator=gen).to(dtype)
    return w, b, x


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("rows", [1, 10, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_output_close_to_full_precision(rows, dtype):
    w, b, _ = _layer(96, 128, dtype)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(3)).to(dtype)
    layer = quantize_linear(w, b)
    y = layer(x)
    assert y.shape == (rows, 96) and y.dtype == dtype
    assert _rel(y, F.linear(x.float(), w.float(), b.float())) < TOLERANCE


def test_leading_dimensions_are_kept():
    w, b, x = _layer(96, 128, torch.bfloat16)
    layer = quantize_linear(w, b)
    assert layer(x).shape == (2, 5, 96)
    assert torch.equal(layer(x)[1], layer(x[1]))


def test_empty_input():
    w, b, _ = _layer(32, 64, torch.bfloat16)
    layer = quantize_linear(w, b)
    assert layer(torch.empty(0, 64, dtype=torch.bfloat16)).shape == (0, 32)


def test_nbytes_counts_low_bit_storage():
    w = torch.randn(256, 256).to(torch.bfloat16)
    layer = quantize_linear(w, None)
    assert layer.mode == "q8"                     # Gaussian codes do not fit 5 bits
    assert layer.nbytes == 256 * 256 + 256 * (256 // 32) * 2   # a code per weight + an fp16 scale per 32
    assert layer.nbytes < w.numel() * 2
