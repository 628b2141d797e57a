"""The C block kernels (engine.quant.gguf_native, native/gguf.c) against gguf-py's dequantization.

Two references, on random blocks of every format (random bytes, the fp16 scale fields set to
sane values so no block holds NaN or inf):
- the kernel's own arithmetic in float64: the activations quantized exactly as the kernel does
  (per block, d = amax / 127, round half to even in float32), times gguf-py's dequantized
  weights. The kernel differs from it by float32 rounding only: a tight relative tolerance;
- ``reference_matmul`` (float32 over the unquantized activations): the kernel is within the
  activation rounding's bound, half a step per input, sum_k |w_k| * d_x(k) / 2.
Run on every vector path: ``scripts/run_tests.sh --as avx2|portable`` builds the others.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from engine.quant import gguf_native
from engine.quant.gguf_blocks import BLOCK_TYPES, BlockWeight, block_matmul, dequantize_rows, reference_matmul

# Byte offsets of each format's fp16 fields (scale, minimum) inside a block.
FP16_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q8_0: (0,), T.Q4_K: (0, 2), T.Q5_K: (0, 2),
               T.Q6_K: (208,)}
FORMATS = sorted(BLOCK_TYPES, key=int)
KERNEL_RTOL = 2e-5   # float32 accumulation against float64, relative to sum |w x|


def random_weight(ggml_type: T, out_features: int, blocks: int, seed: int, pad: int = 0) -> BlockWeight:
    """Random blocks; ``pad`` > 0 makes the rows a strided view into a wider buffer."""
    elems, nbytes = GGML_QUANT_SIZES[ggml_type]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(out_features, blocks, nbytes), dtype=np.uint8)
    for offset in FP16_FIELDS[ggml_type]:
        scales = rng.uniform(-0.02, 0.02, size=(out_features, blocks)).astype(np.float16)
        raw[:, :, offset:offset + 2] = scales.view(np.uint8).reshape(out_features, blocks, 2)
    rows = raw.reshape(out_features, blocks * nbytes)
    if pad:
        wide = np.zeros((out_features, blocks * nbytes + pad), dtype=np.uint8)
        wide[:, 1:1 + blocks * nbytes] = rows
        data = torch.from_numpy(wide)[:, 1:1 + blocks * nbytes]
    else:
        data = torch.from_numpy(rows)
    return BlockWeight(ggml_type, out_features, blocks * elems, data)


def quantize_like_kernel(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes [m, K], scales [m, K / block]) exactly as gguf.c's quantize_block computes them."""
    m, k = x.shape
    xb = x.astype(np.float32).reshape(m, k // block, block)
    amax = np.abs(xb).max(axis=-1)
    safe = np.where(amax > 0, amax, np.float32(1))
    inv = np.float32(127) / safe
    codes = np.clip(np.rint(xb * inv[..., None]), -127, 127)
    codes = np.where(amax[..., None] > 0, codes, 0)
    return codes.reshape(m, k), np.where(amax > 0, amax / np.float32(127), np.float32(0))


def activation_block(ggml_type: T) -> int:
    return 256 if ggml_type in gguf_native.K_FORMATS else 32


def expected(x: torch.Tensor, weight: BlockWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 result over the kernel's quantized activations, sum |w x_hat|, the activation
    rounding bound sum |w| d_x / 2)."""
    block = activation_block(weight.ggml_type)
    codes, scales = quantize_like_kernel(x.float().numpy(), block)
    step = np.repeat(scales.astype(np.float64), block, axis=1)
    x_hat = codes.astype(np.float64) * step
    w = dequantize_rows(weight).numpy().astype(np.float64)
    return x_hat @ w.T, np.abs(x_hat) @ np.abs(w).T, (step / 2) @ np.abs(w).T


@pytest.mark.parametrize("ggml_type", FORMATS, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 2, 7, 13, 33])
def test_kernel_equals_its_float64_arithmetic(ggml_type: T, m: int) -> None:
    weight = random_weight(ggml_type, 37, blocks=3, seed=int(ggml_type) * 100 + m)
    x = torch.randn(m, weight.in_features, generator=torch.Generator().manual_seed(m))
    got = gguf_native.matmul(x, weight.ggml_type, weight.data, weight.in_features).numpy()
    want, magnitude, bound = expected(x, weight)
    assert got.shape == (m, 37)
    assert np.all(np.abs(got - want) <= KERNEL_RTOL * magnitude + 1e-6)
    # Against float32 over the unquantized activations: within half an activation step per input.
    reference = reference_matmul(x, weight).numpy()
    assert np.all(np.abs(got - reference) <= bound * 1.001 + KERNEL_RTOL * magnitude + 1e-6)


@pytest.mark.parametrize("ggml_type", FORMATS, ids=lambda t: t.name)
def test_row_slices_and_strided_rows(ggml_type: T) -> None:
    weight = random_weight(ggml_type, 41, blocks=2, seed=7, pad=5)
    assert weight.data.stride(0) != weight.row_bytes
    x = torch.randn(3, weight.in_features, generator=torch.Generator().manual_seed(3))
    full = gguf_native.matmul(x, weight.ggml_type, weight.data, weight.in_features)
    part = weight.rows(9, 30)
    sliced = gguf_native.matmul(x, part.ggml_type, part.data, part.in_features)
    assert torch.equal(sliced, full[:, 9:30])  # the same kernel on the same rows: the same floats
    want, magnitude, _ = expected(x, part)
    assert np.all(np.abs(sliced.numpy() - want) <= KERNEL_RTOL * magnitude + 1e-6)


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("m", [16, 21, 64])
def test_many_rows_on_strided_rows_equal_their_float64_arithmetic(ggml_type: T, m: int) -> None:
    """From 16 activation rows a call runs Q4_K and Q6_K on AVX2 from 8-row groups unpacked once
    per call; 45 strided rows end in a group of 8 and 5 rows left to the row kernel, and odd m
    leaves one activation row after the passes of two. Every path must stay the kernel's
    arithmetic."""
    weight = random_weight(ggml_type, 45, blocks=3, seed=m, pad=3)
    x = torch.randn(m, weight.in_features, generator=torch.Generator().manual_seed(m))
    got = gguf_native.matmul(x, weight.ggml_type, weight.data, weight.in_features).numpy()
    want, magnitude, _ = expected(x, weight)
    assert got.shape == (m, 45)
    assert np.all(np.abs(got - want) <= KERNEL_RTOL * magnitude + 1e-6)


@pytest.mark.parametrize("ggml_type", FORMATS, ids=lambda t: t.name)
def test_bf16_activations_are_widened(ggml_type: T) -> None:
    weight = random_weight(ggml_type, 19, blocks=2, seed=11)
    x = torch.randn(2, weight.in_features, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    got = gguf_native.matmul(x, weight.ggml_type, weight.data, weight.in_features)
    assert torch.equal(got, gguf_native.matmul(x.float(), weight.ggml_type, weight.data, weight.in_features))


@pytest.mark.parametrize("ggml_type", FORMATS, ids=lambda t: t.name)
def test_zero_and_constant_activation_blocks(ggml_type: T) -> None:
    """An all-zero block quantizes to zero codes with scale 0 (no division by zero)."""
    weight = random_weight(ggml_type, 5, blocks=2, seed=13)
    x = torch.zeros(2, weight.in_features)
    x[1, : activation_block(ggml_type)] = 0.5
    got = gguf_native.matmul(x, weight.ggml_type, weight.data, weight.in_features).numpy()
    assert np.all(got[0] == 0)
    want, magnitude, _ = expected(x, weight)
    assert np.all(np.abs(got - want) <= KERNEL_RTOL * magnitude + 1e-6)


@pytest.mark.parametrize("ggml_type", FORMATS, ids=lambda t: t.name)
def test_dequantize_matches_gguf_py(ggml_type: T) -> None:
    weight = random_weight(ggml_type, 23, blocks=2, seed=17, pad=3)
    reference = dequantize_rows(weight)
    values = gguf_native.dequantize(weight.ggml_type, weight.data, weight.in_features)
    torch.testing.assert_close(values, reference, rtol=1e-6, atol=1e-7)
    ids = torch.tensor([[4, 0], [22, 4]])
    rows = gguf_native.dequantize(weight.ggml_type, weight.data, weight.in_features, ids=ids)
    assert rows.shape == (2, 2, weight.in_features)
    torch.testing.assert_close(rows, reference[ids], rtol=1e-6, atol=1e-7)
    bf16 = gguf_native.dequantize(weight.ggml_type, weight.data, weight.in_features, ids=ids, dtype=torch.bfloat16)
    assert torch.equal(bf16, rows.to(torch.bfloat16))


def test_dequantize_refuses_ids_out_of_range() -> None:
    weight = random_weight(T.Q8_0, 4, blocks=1, seed=1)
    with pytest.raises(IndexError):
        gguf_native.dequantize(weight.ggml_type, weight.data, weight.in_features, ids=torch.tensor([4]))


def test_unsupported_type_and_wrong_sizes_are_refused() -> None:
    data = torch.zeros(2, 64, dtype=torch.uint8)
    with pytest.raises(ValueError, match="no block kernel"):
        gguf_native.matmul(torch.zeros(1, 32), T.Q2_K, data, 32)
    with pytest.raises(ValueError, match="do not hold"):   # 64 bytes are not one Q8_0 block
        gguf_native.matmul(torch.zeros(1, 32), T.Q8_0, data, 32)
    with pytest.raises(ValueError, match="expected"):
        gguf_native.matmul(torch.zeros(1, 64), T.Q8_0, data[:, :34], 32)


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 96])
def test_block_matmul_runs_the_native_paths(ggml_type: T, m: int) -> None:
    """block_matmul (the loader's entry) at decode and prefill sizes: within the kernel's bound
    of the float32 reference (the prefill path, dequantize + GEMM, is tighter still)."""
    weight = random_weight(ggml_type, 33, blocks=2, seed=19)
    x = torch.randn(m, weight.in_features, generator=torch.Generator().manual_seed(2))
    got = block_matmul(x, weight).numpy()
    _, magnitude, bound = expected(x, weight)
    reference = reference_matmul(x, weight).numpy()
    assert got.shape == (m, 33) and got.dtype == np.float32
    assert np.all(np.abs(got - reference) <= bound * 1.001 + KERNEL_RTOL * magnitude + 1e-6)


@pytest.mark.parametrize("ggml_type, rows, float32_gemm", [
    (T.Q5_0, 256, True), (T.Q8_0, 300, True), (T.Q5_0, 255, False), (T.Q4_K, 256, False), (T.Q6_K, 512, False)])
def test_without_bf16_gemm_long_prefills_of_32_input_formats_run_a_float32_gemm(ggml_type, rows, float32_gemm,
                                                                                monkeypatch):
    """Where torch has no bf16 GEMM (AVX2 CPUs), a 32-input format's prefill from F32_MIN_ROWS_32
    rows multiplies slabs dequantized to float32, which beat its integer kernel there; the K
    formats and shorter calls keep the kernels. The float32 path is the float32 reference."""
    from engine.quant import gguf_blocks

    monkeypatch.setattr(gguf_blocks, "_fast_bf16_gemm", lambda: False)
    kernel_calls = []
    real_kernel = gguf_native.matmul
    monkeypatch.setattr(gguf_native, "matmul", lambda *a, **k: kernel_calls.append(1) or real_kernel(*a, **k))
    blocks = 2 if ggml_type in gguf_native.K_FORMATS else 8
    weight = random_weight(ggml_type, 24, blocks, seed=rows)
    x = torch.from_numpy(np.random.default_rng(rows).standard_normal((rows, weight.in_features), dtype=np.float32))
    got = block_matmul(x, weight)
    assert bool(kernel_calls) is not float32_gemm
    if float32_gemm:
        torch.testing.assert_close(got, reference_matmul(x, weight), rtol=1e-5, atol=1e-5)
