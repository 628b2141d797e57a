"""Q4_K, Q6_K, Q5_0 and Q8_0 interleaved by 16 rows (gguf_native.repack_x16, gguf.c's dot_*_x16)
on AVX512-VNNI; Q5_0 and Q4_K on AVX2 (gguf_native.INTERLEAVED_BY_PATH). A format this CPU does not
interleave is skipped.

The repack only moves bytes, so it is checked for identity against an independent numpy
inverse (``uninterleave_x16``); the kernel over the moved bytes is checked against its float64
arithmetic and the float32 reference as every other format is (tests/quant/test_gguf_kernels.py).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.quant import gguf_blocks, gguf_native, prefill_choice
from engine.quant.gguf_blocks import BlockWeight, block_matmul, dequantize_rows, reference_matmul, uninterleave_x16
from tests.quant.test_gguf_kernels import KERNEL_RTOL, expected, random_weight

HERE = gguf_native.INTERLEAVED_BY_PATH[gguf_native.vector_path()]
INTERLEAVED = [pytest.param(kind, marks=pytest.mark.skipif(
    kind not in HERE, reason=f"{kind.name} rows are not interleaved on this CPU's vector path"))
    for kind in (T.Q4_K, T.Q6_K, T.Q5_0, T.Q8_0)]
# A format interleaved here, for the tests of what does not depend on the format
ANY_HERE = next((kind for kind in (T.Q4_K, T.Q5_0) if kind in HERE), None)
needs_one = pytest.mark.skipif(ANY_HERE is None, reason="this CPU's vector path interleaves no format")


@pytest.mark.parametrize("kind", INTERLEAVED)
def test_interleaving_moves_the_bytes_and_nothing_else(kind: T) -> None:
    weight = random_weight(kind, 48, blocks=3, seed=1, pad=7)   # strided rows in, contiguous out
    interleaved = weight.interleave()
    assert interleaved.interleaved and interleaved.data.shape == weight.data.shape
    assert not torch.equal(interleaved.data, weight.data.contiguous())
    assert np.array_equal(uninterleave_x16(interleaved.data.numpy(), kind), weight.data.numpy())


@pytest.mark.parametrize("kind", INTERLEAVED)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9, 16, 21])
def test_interleaved_kernel_equals_its_float64_arithmetic(kind: T, m: int) -> None:
    """Every row count the kernel unrolls (4 activation rows a pass, then 1-3), and from 16 rows
    AVX2's Q4_K groups unpacked once per call (passes of 2, then 1)."""
    weight = random_weight(kind, 32, blocks=3, seed=10 + m)
    interleaved = weight.interleave()
    x = torch.randn(m, weight.in_features, generator=torch.Generator().manual_seed(m))
    got = gguf_native.matmul(x, kind, interleaved.data, weight.in_features, interleaved=True).numpy()
    want, magnitude, bound = expected(x, weight)
    assert np.all(np.abs(got - want) <= KERNEL_RTOL * magnitude + 1e-6)
    assert np.all(np.abs(got - reference_matmul(x, weight).numpy()) <= bound * 1.001 + KERNEL_RTOL * magnitude + 1e-6)
    assert np.all(np.abs(block_matmul(x, interleaved).numpy() - want) <= KERNEL_RTOL * magnitude + 1e-6)


@pytest.mark.parametrize("kind", INTERLEAVED)
def test_interleaved_rows_dequantize_to_the_same_values(kind: T) -> None:
    weight = random_weight(kind, 32, blocks=2, seed=3)
    interleaved = weight.interleave()
    plain = gguf_native.dequantize(kind, weight.data, weight.in_features)
    assert torch.equal(gguf_native.dequantize(kind, interleaved.data, weight.in_features, interleaved=True), plain)
    ids = torch.tensor([31, 0, 17])
    assert torch.equal(gguf_native.dequantize(kind, interleaved.data, weight.in_features, ids=ids, interleaved=True),
                       plain[ids])
    assert torch.equal(dequantize_rows(interleaved, 16, 32), dequantize_rows(weight, 16, 32))


@needs_one
def test_what_cannot_be_interleaved_stays_as_stored() -> None:
    for weight in (random_weight(T.Q4_K, 40, blocks=1, seed=4), random_weight(T.Q6_K, 40, blocks=1, seed=4),
                   random_weight(T.Q8_0, 40, blocks=1, seed=4), random_weight(T.Q5_K, 32, blocks=1, seed=4),
                   random_weight(T.Q4_0, 32, blocks=1, seed=4)):
        assert weight.interleave() is weight
    for kind in {T.Q4_K, T.Q6_K, T.Q5_0, T.Q8_0} - HERE:   # formats this path has no interleaved kernel for
        assert random_weight(kind, 32, blocks=1, seed=4).interleave().interleaved is False
    interleaved = random_weight(ANY_HERE, 32, blocks=1, seed=5).interleave()
    with pytest.raises(ValueError, match="split a group"):
        interleaved.rows(8, 24)
    with pytest.raises(ValueError, match="whole groups"):
        gguf_native.matmul(torch.zeros(1, interleaved.in_features), ANY_HERE, interleaved.data[:8],
                           interleaved.in_features, interleaved=True)


@pytest.mark.parametrize("kind", INTERLEAVED)
@pytest.mark.parametrize("gemm_wins", [False, True])
def test_interleaved_prefill_takes_the_path_measured_faster(monkeypatch, kind: T, gemm_wins: bool) -> None:
    """At prefill sizes an interleaved weight stays in its kernel unless the GEMM measured
    faster for its format; a plain weight takes the GEMM either way (where the CPU has bf16
    GEMM)."""
    asked = []
    monkeypatch.setattr(gguf_blocks, "_fast_bf16_gemm", lambda: True)
    monkeypatch.setattr(gguf_blocks, "_x16_gemm_wins", lambda ggml_type: asked.append(ggml_type) or gemm_wins)
    weight = random_weight(kind, 32, blocks=8 if kind in (T.Q5_0, T.Q8_0) else 2, seed=6)
    interleaved = weight.interleave()
    x = torch.randn(gguf_blocks.dequant_min_rows(kind), weight.in_features, generator=torch.Generator().manual_seed(6))
    kernel = gguf_native.matmul(x, kind, interleaved.data, weight.in_features, interleaved=True)
    gemm = gguf_blocks.slab_matmul(x, interleaved, torch.bfloat16)
    assert not torch.equal(kernel, gemm)
    assert torch.equal(block_matmul(x, interleaved), gemm if gemm_wins else kernel)
    assert asked == [kind]
    assert torch.equal(block_matmul(x, weight), gguf_blocks.slab_matmul(x, weight, torch.bfloat16))
    assert asked == [kind]


@needs_one
def test_the_interleaved_prefill_path_is_measured_once_and_logged(monkeypatch) -> None:
    kinds = sorted(HERE)[:2]
    calls = []
    monkeypatch.setattr(prefill_choice, "measure",
                        lambda kernel, gemm: calls.append((kernel(), gemm())) or {"kernel_ms": 2.0, "gemm_ms": 3.0})
    events = []
    monkeypatch.setattr(prefill_choice, "log_event", lambda logger, event, **fields: events.append((event, fields)))
    gguf_blocks._x16_gemm_wins.cache_clear()
    try:
        assert not gguf_blocks._x16_gemm_wins(kinds[0]) and not gguf_blocks._x16_gemm_wins(kinds[0])
        assert not any(gguf_blocks._x16_gemm_wins(kind) for kind in kinds[1:])
    finally:
        gguf_blocks._x16_gemm_wins.cache_clear()
    assert len(calls) == len(kinds)
    for kernel_out, gemm_out in calls:
        assert kernel_out.shape == gemm_out.shape == (prefill_choice.PROBE_ROWS, gguf_blocks.X16_PROBE_OUT)
    assert events == [("gguf_prefill_path", {"path": "integer_kernel", "kernel_ms": 2.0, "gemm_ms": 3.0,
                                             "rows": prefill_choice.PROBE_ROWS, "format": kind.name})
                      for kind in kinds]


@needs_one
def test_a_tensor_is_interleaved_slab_by_slab_with_its_pages_released(tmp_path, monkeypatch) -> None:
    """The load moves a large tensor a slab at a time and drops each slab's mapped pages as it
    goes; the bytes are those of moving it whole."""
    from engine import gguf_weights
    from engine.gguf_index import read_index
    from tests.tiny_gguf import make_tiny_gguf

    kind = T.Q6_K if T.Q6_K in HERE else ANY_HERE
    path = make_tiny_gguf(tmp_path / "k.gguf", seed=3, architecture="qwen2", types={"*": kind.name},
                          hidden_size=256, intermediate_size=512)
    index = read_index(path)
    name, info = next((n, t) for n, t in index.tensors.items()
                      if t.ggml_type == kind and len(t.shape) == 2 and t.shape[0] % 32 == 0)
    rows, cols = info.shape
    whole = BlockWeight(kind, rows, cols, torch.from_numpy(index.data(name).copy())).interleave()
    released = []
    monkeypatch.setattr(gguf_weights, "INTERLEAVE_SLAB_ROWS", 16)
    monkeypatch.setattr(index, "release", lambda tensor, start=0, stop=None: released.append((tensor, start, stop)))
    part = gguf_weights.GGUFTensors(index).linear_part(name, rows, cols)
    assert part.interleaved and torch.equal(part.data, whole.data)
    row_bytes = whole.row_bytes
    assert released == [(name, s * row_bytes, min(s + 16, rows) * row_bytes) for s in range(0, rows, 16)] + [(name, 0, None)]
