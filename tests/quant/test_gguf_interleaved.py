"""Q4_K interleaved by 16 rows (gguf_native.repack_x16, gguf.c's dot_q4_k_x16) on AVX512-VNNI.

The repack only moves bytes, so it is checked for identity against an independent numpy
inverse (``uninterleave_x16``); the kernel over the moved bytes is checked against its float64
arithmetic and the float32 reference as every other format is (tests/quant/test_gguf_kernels.py).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.quant import gguf_native
from engine.quant.gguf_blocks import block_matmul, dequantize_rows, reference_matmul, uninterleave_x16
from tests.quant.test_gguf_kernels import KERNEL_RTOL, expected, random_weight

pytestmark = pytest.mark.skipif(gguf_native.vector_path() != "avx512-vnni",
                                reason="Q4_K is interleaved only where the AVX512-VNNI kernel reads it")


def test_interleaving_moves_the_bytes_and_nothing_else() -> None:
    weight = random_weight(T.Q4_K, 48, blocks=3, seed=1, pad=7)   # strided rows in, contiguous out
    interleaved = weight.interleave()
    assert interleaved.interleaved and interleaved.data.shape == weight.data.shape
    assert not torch.equal(interleaved.data, weight.data.contiguous())
    assert np.array_equal(uninterleave_x16(interleaved.data.numpy()), weight.data.numpy())


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9])
def test_interleaved_kernel_equals_its_float64_arithmetic(m: int) -> None:
    """Every row count the kernel unrolls (4 activation rows a pass, then 1-3)."""
    weight = random_weight(T.Q4_K, 32, blocks=3, seed=10 + m)
    interleaved = weight.interleave()
    x = torch.randn(m, weight.in_features, generator=torch.Generator().manual_seed(m))
    got = gguf_native.matmul(x, T.Q4_K, interleaved.data, weight.in_features, interleaved=True).numpy()
    want, magnitude, bound = expected(x, weight)
    assert np.all(np.abs(got - want) <= KERNEL_RTOL * magnitude + 1e-6)
    assert np.all(np.abs(got - reference_matmul(x, weight).numpy()) <= bound * 1.001 + KERNEL_RTOL * magnitude + 1e-6)
    assert np.all(np.abs(block_matmul(x, interleaved).numpy() - want) <= KERNEL_RTOL * magnitude + 1e-6)


def test_interleaved_rows_dequantize_to_the_same_values() -> None:
    weight = random_weight(T.Q4_K, 32, blocks=2, seed=3)
    interleaved = weight.interleave()
    plain = gguf_native.dequantize(T.Q4_K, weight.data, weight.in_features)
    assert torch.equal(gguf_native.dequantize(T.Q4_K, interleaved.data, weight.in_features, interleaved=True), plain)
    ids = torch.tensor([31, 0, 17])
    assert torch.equal(gguf_native.dequantize(T.Q4_K, interleaved.data, weight.in_features, ids=ids, interleaved=True),
                       plain[ids])
    assert torch.equal(dequantize_rows(interleaved, 16, 32), dequantize_rows(weight, 16, 32))


def test_what_cannot_be_interleaved_stays_as_stored() -> None:
    for weight in (random_weight(T.Q4_K, 40, blocks=1, seed=4), random_weight(T.Q6_K, 32, blocks=1, seed=4)):
        assert weight.interleave() is weight
    interleaved = random_weight(T.Q4_K, 32, blocks=1, seed=5).interleave()
    with pytest.raises(ValueError, match="split a group"):
        interleaved.rows(8, 24)
    with pytest.raises(ValueError, match="whole groups"):
        gguf_native.matmul(torch.zeros(1, 256), T.Q4_K, interleaved.data[:8], 256, interleaved=True)
