"""bf16 projections widened to float32 where this CPU's oneDNN has no bf16 kernels
(engine.weights.widened_linear): ``F.linear``'s numbers within bf16's rounding, in any shape,
and the plain bf16 path kept for a few rows and on CPUs that have the kernels."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import engine.weights as weights
from engine.weights import WIDEN_MIN_ROWS, Linear, widened_linear
from tests.agreement import equal_fraction


def _operands(rows: int, out_features: int, with_bias: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(out_features, generator=gen).to(torch.bfloat16) if with_bias else None
    x = torch.randn(rows, 64, generator=gen).to(torch.bfloat16)
    return x, weight, bias


@pytest.mark.parametrize("rows", [1, 6, 37])
@pytest.mark.parametrize("with_bias", [False, True])
def test_widened_matches_float32_reference(rows, with_bias, monkeypatch):
    # a chunk of 7 output rows: 301 is not a multiple, so the last chunk is short
    monkeypatch.setattr(weights, "WIDEN_CHUNK_ELEMENTS", 7 * 64)
    x, weight, bias = _operands(rows, 301, with_bias, seed=rows)
    got = widened_linear(x, weight, bias)
    want = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 301)
    # float32 sums of 64 products in another order, rounded once to bf16
    torch.testing.assert_close(got.float(), want, rtol=8e-3, atol=1e-3)
    assert equal_fraction(got, want.to(torch.bfloat16)) > 0.9


def test_widened_keeps_leading_dimensions_and_strided_inputs():
    x, weight, _ = _operands(2 * 9, 40, False)
    batched = x.reshape(2, 9, 64)
    strided = torch.cat([x, x], dim=1)[:, ::2]  # a non-contiguous [18, 64] input
    torch.testing.assert_close(widened_linear(batched, weight, None), widened_linear(x, weight, None).reshape(2, 9, 40))
    torch.testing.assert_close(widened_linear(strided, weight, None).float(), F.linear(strided.float(), weight.float()),
                               rtol=8e-3, atol=1e-3)


@pytest.mark.parametrize("missing, rows, widened", [(True, WIDEN_MIN_ROWS, True), (True, WIDEN_MIN_ROWS - 1, False),
                                                    (False, 64, False)])
def test_linear_widens_only_many_rows_without_bf16_kernels(missing, rows, widened, monkeypatch):
    calls = []
    monkeypatch.setattr(weights, "bf16_gemm_missing", lambda: missing)
    monkeypatch.setattr(weights, "widened_linear", lambda *args: calls.append(args) or F.linear(*args))
    x, weight, bias = _operands(rows, 16, True)
    Linear(weight, bias)(x)
    Linear(weight.float(), bias.float())(x.float())  # float32 is never widened
    assert len(calls) == int(widened)
