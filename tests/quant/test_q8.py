"""``q8``: int8 in groups of 32 and our C kernel (engine/quant/native/q8.c).

The kernel splits activations per group of 32 into two int8 parts and multiplies in integers,
so it is checked against an exact emulation of that arithmetic (not only "close to float"), for both
of its code paths: the one this machine builds (AVX512-VNNI or AVX2), and the AVX2 and portable
builds other CPUs get (built here with their -march flags)."""
from __future__ import annotations

import ctypes

import pytest
import torch

from engine.quant import kernels, native, q8
from engine.quant.layer import QuantizedEmbedding, quantize_linear

SHAPES = [(1, 896, 64), (3, 96, 40), (7, 4864, 48), (5, 544, 16), (9, 64, 33)]  # M, K, N (K: odd group counts too)


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def _emulate(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, precise: bool = True) -> torch.Tensor:
    """The kernel's arithmetic: activations per group of 32 as two int8 parts (hi, and the
    remainder in 1/254 steps; only hi when not ``precise``), integer dots with the codes, then
    the two scales (float64)."""
    m, k = x.shape
    groups = x.float().reshape(m, k // 32, 32)
    amax = groups.abs().amax(-1)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    scaled = groups * inv[..., None]
    hi = torch.round(scaled).clamp(-127, 127)
    lo = torch.round((scaled - hi) * 254).clamp(-127, 127)
    parts = hi.double() + (lo.double() / 254 if precise else 0)
    w = (q8.deinterleave(codes).double() - 128).reshape(codes.shape[0], k // 32, 32)
    dots = torch.einsum("mgj,ngj->mng", parts, w)
    return (dots * (amax / 127).double()[:, None, :] * scales.double()[None]).sum(-1)


def test_round_trip_within_half_a_step_of_each_group():
    w = _weight(40, 96)
    w[3, :32] = 0.0                                   # an all-zero group
    codes, scales = q8.quantize(w)
    back = q8.dequantize(codes, scales)
    step = scales.float().repeat_interleave(32, dim=1)
    assert torch.all((back - w).abs() <= step / 2 + 1e-7)
    assert torch.all(scales.float().abs() * 127 >= w.abs().reshape(40, 3, 32).amax(-1))  # fp16 rounded up
    assert torch.equal(back[3, :32], torch.zeros(32))
    plain = q8.deinterleave(codes)
    assert int(plain.min()) >= 1 and int(plain.max()) <= 255 and torch.equal(q8.interleave(plain), codes)


def test_values_already_on_a_q8_grid_are_kept_exactly():
    """A Q8_0 / Q5_0 tensor (codes times an fp16 scale per 32) comes back bit for bit."""
    gen = torch.Generator().manual_seed(3)
    d = (torch.rand(16, 4, generator=gen) * 0.01 + 1e-3).to(torch.float16).float()  # fp16 scales, as in a GGUF
    c = torch.randint(-16, 16, (16, 4, 32), generator=gen).float()
    c[..., 0] = -16                                   # Q5_0's amax is 16 steps
    w = (c * d[..., None]).reshape(16, 128)
    codes, scales = q8.quantize(w)
    assert torch.equal(q8.dequantize(codes, scales), w)


def _q5_grid(n: int, k: int, seed: int = 3) -> torch.Tensor:
    """Weights as a GGUF Q5_0 tensor holds them: d * (u - 16), fp16 d of either sign."""
    gen = torch.Generator().manual_seed(seed)
    d = ((torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-3) * (torch.randint(0, 2, (n, k // 32), generator=gen) * 2 - 1))
    u = torch.randint(0, 32, (n, k // 32, 32), generator=gen).float()
    u[..., 0] = 0                                     # the extreme weight sits at u = 0
    return ((u - 16) * d.to(torch.float16).float()[..., None]).reshape(n, k)


@pytest.mark.parametrize("k", [896, 4864, 96, 544])
def test_q5_packing_is_lossless_for_q5_grids_and_refused_otherwise(k):
    w = _q5_grid(24, k)
    codes, scales = q8.quantize(w)
    packed = q8.pack5(codes)
    assert packed is not None and packed.shape == (24, native.library().ms_q5_row_bytes(k))
    if k in (896, 4864):                                     # the default model's shapes
        assert packed.numel() < codes.numel() * 0.75          # 5 bits plus the padding of a last block
    assert torch.equal(q8.unpack5(packed, k), codes) and torch.equal(q8.dequantize(codes, scales), w)
    assert q8.pack5(q8.quantize(_weight(24, k))[0]) is None    # plain weights need 8 bits


@pytest.mark.parametrize("m", [1, 3, 6, 11])   # 6 and 11: tiles from the q5 rows unpacked once (q8.c)
@pytest.mark.parametrize("precise", [True, False])
def test_q5_kernel_equals_the_q8_kernel(m, precise):
    codes, scales = q8.quantize(_q5_grid(40, 896))
    x = torch.randn(m, 896).to(torch.bfloat16)
    bias = torch.randn(40)
    want = q8.linear(x, codes, scales, bias, precise=precise)
    got = q8.linear(x, q8.pack5(codes), scales, bias, precise=precise, packed5=True)
    assert torch.equal(got, want)


@pytest.mark.parametrize("five_bits", [True, False])
def test_layer_stores_q5_grids_in_five_bits_where_that_reads_faster(monkeypatch, five_bits):
    monkeypatch.setattr(q8, "packs_five_bits", lambda: five_bits)
    w = _q5_grid(32, 896)
    layer = quantize_linear(w, torch.randn(32))
    plain = quantize_linear(_weight(32, 896), None)
    assert plain.mode == "q8"
    assert (layer.mode, layer.nbytes < plain.nbytes) == (("q5", True) if five_bits else ("q8", False))
    torch.testing.assert_close(layer.dequantize(), w)
    x = torch.randn(2, 896, generator=torch.Generator().manual_seed(0))
    # two-byte activations keep ~16 bits per group: over 200 random x the error reached 1.2x a
    # 1e-4 tolerance (outputs up to ~6), so unseeded it failed about one run in 15
    torch.testing.assert_close(layer(x), x @ w.T + layer.bias, rtol=1e-4, atol=3e-4)


def test_inputs_off_a_multiple_of_32_are_zero_padded():
    w, x = _weight(8, 40), torch.randn(2, 40)
    layer = quantize_linear(w, None)
    assert layer.qweight.shape == (8, 64) and layer.dequantize().shape == (8, 40)
    torch.testing.assert_close(layer(x), x @ layer.dequantize().T, rtol=0.02, atol=0.02)


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("precise", [True, False])
def test_kernel_equals_its_integer_arithmetic(m, k, n, dtype, precise):
    codes, scales = q8.quantize(_weight(n, k, seed=m))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).to(dtype)
    bias = torch.randn(n)
    got = q8.linear(x, codes, scales, bias, precise=precise)
    want = _emulate(x.float(), codes, scales, precise) + bias.double()
    assert got.dtype == dtype and got.shape == (m, n)
    tol = 1e-5 if dtype == torch.float32 else 8e-3     # bf16: the output's own rounding
    assert ((got.double() - want).abs() / want.abs().max()).max() < tol


@pytest.mark.parametrize("five_bits", [False, True])
@pytest.mark.parametrize("precise", [True, False])
def test_rows_are_independent_of_the_batch(precise, five_bits):
    """At one precision a row's result does not depend on which rows share the call (tiles of
    2-4 rows, the first fetching ahead, q5 rows unpacked once for many rows)."""
    codes, scales = q8.quantize(_q5_grid(24, 896) if five_bits else _weight(24, 896))
    if five_bits:
        codes = q8.pack5(codes)
    x = torch.randn(11, 896)
    together = q8.linear(x, codes, scales, None, precise=precise, packed5=five_bits)
    alone = torch.cat([q8.linear(x[i:i + 1], codes, scales, None, precise=precise, packed5=five_bits)
                       for i in range(11)])
    assert torch.equal(together, alone)


@pytest.mark.parametrize("precise", [True, False])
def test_bf16_outputs_are_the_float_outputs_rounded_as_torch_rounds(precise):
    """Whole-width tiles sum and store their outputs in vectors, a last odd column one at a
    time: both give the float result (+ bias) rounded to bf16 as torch rounds it."""
    codes, scales = q8.quantize(_weight(27, 896))
    x = torch.randn(9, 896).bfloat16()
    bias = torch.randn(27)
    for m in (1, 2, 3, 4, 9):
        exact = q8.linear(x[:m].float(), codes, scales, bias, precise=precise)
        got = q8.linear(x[:m], codes, scales, bias, precise=precise)
        assert torch.equal(got.view(torch.int16), exact.bfloat16().view(torch.int16))


def test_activations_take_one_byte_only_in_big_batched_decode_steps():
    """Two-byte activations (error near float) everywhere, prefill included, except calls of
    more than PRECISE_MAX_ROWS rows inside batched_decode (one byte: ~100x the error)."""
    w = _weight(64, 896)
    codes, scales = q8.quantize(w)
    exact = q8.dequantize(codes, scales)

    def error(rows: int) -> float:
        x = torch.randn(rows, 896)
        return ((q8.linear(x, codes, scales, None) - x @ exact.T).norm() / (x @ exact.T).norm()).item()

    assert error(1) < 1e-4 and error(40) < 1e-4
    with q8.batched_decode():
        assert error(q8.PRECISE_MAX_ROWS) < 1e-4
        assert 1e-3 < error(q8.PRECISE_MAX_ROWS + 1) < 2e-2
    assert error(q8.PRECISE_MAX_ROWS + 1) < 1e-4


def _cpu_has(*flags: str) -> bool:
    text = open("/proc/cpuinfo").read()
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return all(flag in line.split() for flag in flags)


BUILDS = [("x86-64", "portable"), ("x86-64-v3", "avx2")]


@pytest.mark.heavy
@pytest.mark.parametrize("march,path", BUILDS)
def test_every_build_gives_the_kernels_integer_arithmetic(tmp_path, monkeypatch, march, path):
    """The AVX2 build (CPUs without AVX-512) and the portable C loop, built here with their
    -march flags: q8 and q5 rows, one and two activation bytes, equal the exact emulation and
    this machine's own build."""
    if path == "avx2" and not _cpu_has("avx2", "fma", "f16c"):
        pytest.skip("this CPU cannot run an AVX2 build")
    monkeypatch.setattr(native, "FLAGS", tuple(f for f in native.FLAGS if f != "-march=native") + (f"-march={march}",))
    lib = ctypes.CDLL(str(native.build(tmp_path)))
    for name in ("ms_q8_linear", "ms_q5_linear"):
        getattr(lib, name).argtypes = getattr(native.library(), name).argtypes
    assert native.VECTOR_PATHS[lib.ms_q8_simd()] == path
    codes, scales = q8.quantize(_q5_grid(20, 896))
    packed = q8.pack5(codes)
    for m in (1, 3, 6):
        x = torch.randn(m, 896, generator=torch.Generator().manual_seed(m))
        out = torch.empty(m, 20)
        for precise in (0, 1):
            want = _emulate(x, codes, scales, bool(precise))
            for fn, weights in ((lib.ms_q8_linear, codes), (lib.ms_q5_linear, packed)):
                assert fn(x.data_ptr(), 0, m, 896, weights.data_ptr(), scales.data_ptr(), 20, None,
                          out.data_ptr(), 0, 2, precise) == 0
                here = q8.linear(x, codes, scales, None, precise=bool(precise)).double()
                for reference in (want, here):   # float sums may run in another order: 1e-5 of the range
                    assert ((out.double() - reference).abs() / reference.abs().max()).max() < 1e-5


def test_library_is_cached_per_source_and_cpu():
    """In the cache dir every test's kernels share (a fresh build here cost ~12 s of compiling;
    the builds into a new folder are test_every_build_...'s)."""
    first = native.build()
    assert native.build() == first and first.name.startswith("q8-") and first.stat().st_size > 0


def test_missing_compiler_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-cc")
    with pytest.raises(native.NativeBuildError, match="no C compiler"):
        native.build(tmp_path)


def test_five_bits_are_kept_where_the_vector_path_reads_them_faster(monkeypatch):
    for path, five in (("avx512-vnni", True), ("avx2", False)):
        monkeypatch.setattr(native, "vector_path", lambda path=path: path)
        assert q8.packs_five_bits() is five


def test_self_check_passes_here_and_names_the_setting_without_a_vector_path(monkeypatch):
    kernels.check_kernels.cache_clear()
    kernels.check_kernels("q8")                       # this machine: AVX512-VNNI or AVX2
    monkeypatch.setattr(native, "vector_path", lambda: "portable")
    kernels.check_kernels.cache_clear()
    with pytest.raises(kernels.QuantKernelError, match="MINISERVE_QUANT=q8 needs a CPU with AVX2"):
        kernels.check_kernels("q8")
    kernels.check_kernels.cache_clear()


def test_grouped_embedding_rows():
    table = _weight(50, 64).to(torch.bfloat16)
    emb = QuantizedEmbedding.from_table(table)
    assert emb.scales.shape == (50, 2)
    ids = torch.tensor([[0, 7, 49]])
    got = emb.lookup(ids)
    assert got.shape == (1, 3, 64) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), table[ids].float(), rtol=0.02, atol=2e-3)


def test_embedding_on_a_q5_grid_is_packed_and_exact():
    table = _q5_grid(40, 96)
    emb = QuantizedEmbedding.from_table(table, dtype=torch.float32)
    plain = QuantizedEmbedding.from_table(_weight(40, 96))
    assert emb.packed5 and not plain.packed5 and emb.shape == (40, 96)
    ids = torch.tensor([[3, 0], [39, 3]])
    assert torch.equal(emb.lookup(ids), table[ids])


def test_packed_embedding_rows_match_unpacking_and_reject_bad_ids():
    table = _q5_grid(40, 896)
    emb = QuantizedEmbedding.from_table(table, dtype=torch.bfloat16)
    ids = torch.tensor([5, 0, 39])
    assert torch.equal(emb.lookup(ids), table[ids].to(torch.bfloat16))
    with pytest.raises(IndexError):
        emb.lookup(torch.tensor([40]))


@pytest.mark.parametrize("packed", [False, True])
def test_many_row_calls_unpack_to_bf16_and_run_a_gemm(monkeypatch, packed):
    """Prefill-sized bf16 calls on a CPU with bf16 GEMM kernels: the weights unpacked to bf16
    (exactly the stored values, rounded) times x; inside batched_decode the integer kernel runs."""
    monkeypatch.setattr(q8, "_fast_bf16_gemm", lambda: True)
    monkeypatch.setattr(q8, "_bf16_gemm_wins", lambda: True)
    w = _q5_grid(48, 896) if packed else _weight(48, 896)
    codes, scales = q8.quantize(w)
    if packed:
        codes = q8.pack5(codes)
    assert torch.equal(q8.dequantize_bf16(codes, scales, packed), w.to(torch.bfloat16) if packed
                       else q8.dequantize(codes, scales).to(torch.bfloat16))
    x = torch.randn(q8.DEQUANT_MIN_ROWS, 896).to(torch.bfloat16)
    bias = torch.randn(48)
    want = torch.nn.functional.linear(x, q8.dequantize_bf16(codes, scales, packed), bias.to(torch.bfloat16))
    assert torch.equal(q8.linear(x, codes, scales, bias, packed5=packed), want)
    with q8.batched_decode():
        fast = q8.linear(x, codes, scales, bias, packed5=packed)
    assert not torch.equal(fast, want)
    torch.testing.assert_close(fast.float(), want.float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("fast_bf16,gemm_wins", [(True, True), (True, False), (False, False)])
def test_prefill_calls_take_the_fastest_path_this_cpu_has(monkeypatch, fast_bf16, gemm_wins):
    """Long calls outside batched decode: bf16 GEMM on unpacked weights where the CPU has bf16
    kernels and they measured faster; with bf16 kernels that lost, the integer kernel at every
    length; without them the integer kernel up to DEQUANT_F32_MIN_ROWS rows, float32 beyond."""
    monkeypatch.setattr(q8, "_fast_bf16_gemm", lambda: fast_bf16)
    monkeypatch.setattr(q8, "_bf16_gemm_wins", lambda: gemm_wins)
    codes, scales = q8.quantize(_weight(24, 96))
    exact = q8.dequantize(codes, scales)
    for rows in (q8.DEQUANT_MIN_ROWS, q8.DEQUANT_F32_MIN_ROWS):
        x = torch.randn(rows, 96).to(torch.bfloat16)
        got = q8.linear(x, codes, scales, None)
        integer = q8.linear(x, codes, scales, None, precise=True)
        kernel = (fast_bf16 and not gemm_wins) or (not fast_bf16 and rows < q8.DEQUANT_F32_MIN_ROWS)
        assert torch.equal(got, integer) == kernel
        torch.testing.assert_close(got.float(), x.float() @ exact.T, rtol=0.02, atol=0.02)


def test_the_prefill_path_is_measured_once_and_keeps_the_gemm_only_where_it_wins(monkeypatch):
    from engine.quant import prefill_choice

    assert prefill_choice.gemm_wins(kernel_ms=10.0, gemm_ms=8.0)
    assert not prefill_choice.gemm_wins(kernel_ms=10.0, gemm_ms=9.5)     # within the margin: the kernel
    assert not prefill_choice.gemm_wins(kernel_ms=8.0, gemm_ms=10.0)
    ran = []
    timings = prefill_choice.measure(lambda: ran.append("kernel"), lambda: ran.append("gemm"))
    assert timings["kernel_ms"] > 0 and timings["gemm_ms"] > 0
    assert ran.count("kernel") == ran.count("gemm") == 1 + prefill_choice.REPEATS   # warm-up, then interleaved
    calls = []
    monkeypatch.setattr(prefill_choice, "measure",
                        lambda kernel, gemm: calls.append(1) or {"kernel_ms": 9.0, "gemm_ms": 3.0})
    q8._bf16_gemm_wins.cache_clear()
    try:
        assert q8._bf16_gemm_wins() and q8._bf16_gemm_wins() and calls == [1]
    finally:
        q8._bf16_gemm_wins.cache_clear()
