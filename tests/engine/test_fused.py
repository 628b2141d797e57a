"""The low-bit forward's fused C operations (engine/ops/c_calls.py, engine/quant/native/decode.c)
against the torch operations they replace, and the choice between them (engine/ops/choose.py)."""
from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

from engine.ops import c_calls
from engine.ops import choose
from engine.ops.fused_ops import CAttentionOps, FusedOps
from engine.ops.torch_ops import TorchOps, apply_rotary, grouped_attention, rms_norm
from engine.quant import native
from tests.agreement import equal_fraction, ulps_apart

BF16 = torch.bfloat16


def _randn(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(BF16)


@pytest.mark.parametrize("rows,dim", [(1, 896), (5, 896), (3, 72)])
def test_rms_norm_matches_torch_within_a_rounding_step(rows, dim):
    x, weight = _randn(rows, dim, scale=3.0), _randn(dim, seed=1)
    got, want = c_calls.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6)
    assert got.dtype == BF16 and got.shape == want.shape
    assert ulps_apart(got, want) <= 1            # the float32 sum may round in another order
    assert (got == want).float().mean() > 0.99


def test_rotary_in_place_matches_torch_within_a_rounding_step():
    """Elementwise in bf16 with the same roundings, so nearly always transformers' very bits;
    torch's vector kernels may fuse a multiply-add where the C build does not (or the reverse)."""
    n, heads, kv_heads, dim = 3, 14, 2, 64
    qkv = _randn(n, (heads + 2 * kv_heads) * dim, scale=2.0)
    cos, sin = _randn(n, 1, dim, seed=1), _randn(n, 1, dim, seed=2)
    k_end = (heads + kv_heads) * dim
    want = apply_rotary(qkv[:, :k_end].view(n, heads + kv_heads, dim), cos, sin)
    v_before = qkv[:, k_end:].clone()
    c_calls.rotary_(qkv, heads + kv_heads, dim, cos, sin)
    got = qkv[:, :k_end].view(n, heads + kv_heads, dim)
    assert ulps_apart(got, want) <= 1 and equal_fraction(got, want) > 0.99
    assert torch.equal(qkv[:, k_end:], v_before)  # v untouched


def test_silu_mul_matches_torch():
    gate_up = _randn(4, 2 * 4864, scale=4.0)
    gate, up = gate_up.chunk(2, dim=-1)
    want = F.silu(gate).mul(up)
    got = c_calls.silu_mul(gate_up)
    assert ulps_apart(got, want) <= 1            # our exp is within ~2 float ulps of torch's
    assert (got == want).float().mean() > 0.99


@pytest.mark.parametrize("position", [0, 5, 130])
def test_attend_decode_writes_the_cache_and_matches_float32_attention(position):
    heads, kv_heads, dim, capacity = 14, 2, 64, 200
    keys, values = _randn(kv_heads, capacity, dim, seed=1), _randn(kv_heads, capacity, dim, seed=2)
    q, k, v = _randn(1, heads, dim, seed=3), _randn(1, kv_heads, dim, seed=4), _randn(1, kv_heads, dim, seed=5)
    got = c_calls.attend_decode(q, k, v, keys, values, position)
    assert torch.equal(keys[:, position], k[0]) and torch.equal(values[:, position], v[0])
    end = position + 1
    want = grouped_attention(q.float(), keys[:, :end].float(), values[:, :end].float(), position)
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)   # bf16 output rounding
    assert got.shape == (1, heads * dim) and got.dtype == BF16


@pytest.mark.heavy
def test_portable_build_of_the_fused_ops_matches_the_avx512_one(tmp_path, monkeypatch):
    """A CPU without AVX-512 gets the scalar loops: the same numbers up to exp's last bits."""
    monkeypatch.setattr(native, "FLAGS", tuple(f for f in native.FLAGS if f != "-march=native") + ("-march=x86-64",))
    portable = ctypes.CDLL(str(native.build(tmp_path)))
    native._declare_decode(portable)
    monkeypatch.setattr(c_calls, "_library", lambda: portable)
    x, weight = _randn(2, 896, scale=3.0), _randn(896, seed=1)
    assert ulps_apart(c_calls.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6)) <= 1
    gate_up = _randn(2, 2 * 320, scale=4.0)
    gate, up = gate_up.chunk(2, dim=-1)
    assert ulps_apart(c_calls.silu_mul(gate_up), F.silu(gate).mul(up)) <= 1
    keys, values = _randn(2, 50, 64, seed=1), _randn(2, 50, 64, seed=2)
    q, k, v = _randn(1, 14, 64, seed=3), _randn(1, 2, 64, seed=4), _randn(1, 2, 64, seed=5)
    got = c_calls.attend_decode(q, k, v, keys, values, 20)      # writes position 20 first
    want = grouped_attention(q.float(), keys[:, :21].float(), values[:, :21].float(), 20)
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)


def _twin_pools(num_blocks: int, num_layers: int, seed: int) -> list:
    """Two pools holding the same random K/V: one for torch's path, one for the C path."""
    from engine.paged.pool import KVBlockPool, KVGeometry

    geometry = KVGeometry(num_layers=num_layers, num_kv_heads=2, head_dim=64)
    pools = [KVBlockPool(num_blocks, 4, geometry, dtype=BF16) for _ in range(2)]
    for pool in pools:
        pool.k.copy_(_randn(*pool.k.shape, seed=seed))
        pool.v.copy_(_randn(*pool.v.shape, seed=seed + 1))
    return pools


def test_paged_decode_matches_the_gathering_attention_and_writes_the_same_slots():
    from engine.paged.attention import SeqChunk, build_batch, paged_attention

    block_size, pools = 4, _twin_pools(12, 3, seed=7)
    # three sequences decoding one token each, at different lengths, sharing block 2 (a prefix)
    chunks = [SeqChunk([2, 5, 7], 9, 1), SeqChunk([2, 3], 4, 1), SeqChunk([2, 0, 1, 11], 14, 1)]
    batch = build_batch(chunks, block_size)
    q, k, v = _randn(3, 14, 64, seed=1), _randn(3, 2, 64, seed=2), _randn(3, 2, 64, seed=3)
    want = paged_attention(pools[0], 1, batch, q, k, v)
    got = paged_attention(pools[1], 1, batch, q, k, v, ops=CAttentionOps())
    assert torch.equal(pools[0].k, pools[1].k) and torch.equal(pools[0].v, pools[1].v)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert got.shape == want.shape == (3, 14, 64)


def test_fused_only_for_low_bit_bf16_on_cpu_and_said_when_the_library_is_missing(monkeypatch, caplog):
    from types import SimpleNamespace

    from engine.quant.native import NativeBuildError

    def chosen(weights) -> tuple[type, bool]:
        ops = choose.small_ops_for(weights)
        return type(ops), ops.exact

    weights = SimpleNamespace(dtype=BF16, device=torch.device("cpu"))
    monkeypatch.setattr(choose, "exact_attention", lambda w: True)       # full precision: never
    assert chosen(weights) == (TorchOps, True)
    monkeypatch.setattr(choose, "exact_attention", lambda w: False)      # low-bit bf16 on CPU
    for like_torch, gguf_blocks, kind in ((True, False, CAttentionOps), (False, False, FusedOps),
                                          (False, True, CAttentionOps)):
        monkeypatch.setattr(choose, "attention_like_torch", lambda c=like_torch: c)
        monkeypatch.setattr(choose, "runs_gguf_blocks", lambda w, g=gguf_blocks: g)
        assert chosen(weights) == (kind, False)
    assert chosen(SimpleNamespace(dtype=torch.float32, device=torch.device("cpu"))) == (TorchOps, False)

    def missing():
        raise NativeBuildError("no C compiler: 'cc' is not on PATH")
    monkeypatch.setattr(c_calls, "_library", missing)
    assert chosen(weights) == (TorchOps, False)                          # torch's, folded attention
    assert any("fused_ops_unavailable" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("counts", [[1, 4, 2], [3], [5, 1]])
def test_paged_steps_with_several_tokens_per_sequence_match_the_torch_path(counts):
    """Verify-shaped steps (a pending token + drafts) and short chunks: each token attends
    causally over its own sequence through the block table."""
    from engine.paged.attention import SeqChunk, build_batch, paged_attention

    block_size, pools = 4, _twin_pools(16, 2, seed=9)
    tables = [[2, 5, 7, 9], [2, 3, 4], [2, 0, 1, 11, 12]]
    starts = [9, 6, 14]
    chunks = [SeqChunk(tables[i], starts[i], n) for i, n in enumerate(counts)]
    batch = build_batch(chunks, block_size)
    n = sum(counts)
    q, k, v = _randn(n, 14, 64, seed=1), _randn(n, 2, 64, seed=2), _randn(n, 2, 64, seed=3)
    want = paged_attention(pools[0], 0, batch, q, k, v)
    got = paged_attention(pools[1], 0, batch, q, k, v, ops=CAttentionOps())
    assert torch.equal(pools[0].k, pools[1].k) and torch.equal(pools[0].v, pools[1].v)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_attention_runs_in_c_only_where_it_rounds_like_torchs_kernels(monkeypatch):
    """Measured: on torch's AVX-512 kernels the C attention keeps q8's agreement with bf16; on
    its AVX2 ones it does not (engine.ops.choose.ATTENTION_LIKE_TORCH has the figures), so there it
    stays torch's."""
    for capability, expected in (("AVX512", True), ("AVX2", False), ("DEFAULT", False)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert choose.attention_like_torch() is expected


def test_rms_norm_sums_in_torchs_order_where_its_vectors_hold_8_floats():
    """The sum of squares in torch's order (aten's cascade sum) for 8-lane vectors (AVX2 and
    default kernels); an AVX-512 torch keeps the C order, within a rounding step (above). The
    same order leaves the results a rounding step apart at most, and nearly all bit for bit
    (a kernel's rounding is not promised across CPUs, so not asserted for every element)."""
    if c_calls.torch_sum_lanes() != 8:
        pytest.skip("torch runs AVX-512 kernels here: the C RMSNorm sums in its own order")
    for dim in (896, 64, 200):
        for seed in range(20):
            x, weight = _randn(3, dim, seed=seed, scale=3.0), _randn(dim, seed=seed + 100)
            got, want = c_calls.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6)
            assert ulps_apart(got, want) <= 1 and equal_fraction(got, want) > 0.99, (dim, seed)


@pytest.mark.parametrize("shape", ["one decode", "decodes", "one chunk", "fresh prefill", "verify steps", "mixed"])
def test_paged_gather_in_c_gives_torchs_attention_the_same_values(shape):
    """Where the attention stays torch's, a low-bit paged step writes and gathers its K/V in
    one C call: the pool and the attention's output are bit for bit those of torch's indexing."""
    from engine.paged.attention import SeqChunk, build_batch, paged_attention

    block_size, pools = 4, _twin_pools(16, 3, seed=11)
    tables = [[2, 5, 7, 9], [2, 3, 4], [2, 0, 1, 11, 12]]
    steps = {"one decode": [(0, 13, 1)], "decodes": [(0, 9, 1), (1, 6, 1), (2, 14, 1)],
             "one chunk": [(2, 6, 9)], "fresh prefill": [(1, 0, 11)], "verify steps": [(0, 9, 4), (2, 14, 3)],
             "mixed": [(0, 2, 11), (1, 6, 1), (2, 12, 6)]}[shape]
    batch = build_batch([SeqChunk(tables[row], start, n) for row, start, n in steps], block_size)
    n = sum(step[2] for step in steps)
    q, k, v = _randn(n, 14, 64, seed=1), _randn(n, 2, 64, seed=2), _randn(n, 2, 64, seed=3)
    want = paged_attention(pools[0], 1, batch, q, k, v)
    got = paged_attention(pools[1], 1, batch, q, k, v, ops=FusedOps())
    assert torch.equal(pools[0].k, pools[1].k) and torch.equal(pools[0].v, pools[1].v)
    assert torch.equal(got, want)


def test_paged_gather_refuses_positions_beyond_its_blocks():
    from engine.paged.pool import KVBlockPool, KVGeometry

    pool = KVBlockPool(4, 4, KVGeometry(num_layers=1, num_kv_heads=2, head_dim=64), dtype=BF16)
    k = _randn(1, 2, 64)
    with pytest.raises(ValueError, match="9 positions from 2 blocks"):
        c_calls.paged_gather(pool, 0, torch.tensor([[1, 2]]), torch.tensor([5]), k, k, 9)


@pytest.mark.parametrize("n,window", [(20, None), (3, 8), (1, 4)])
def test_c_attention_ops_hand_what_c_does_not_cover_to_torch_bit_for_bit(n, window):
    """Steps longer than the C calls take, or past a sliding window: the C attention's ops run
    torch's (folded) attention, the same bits and the same cache writes as torch's ops."""
    heads, kv_heads, dim, start = 14, 2, 64, 6
    caches = [(_randn(kv_heads, 40, dim, seed=1), _randn(kv_heads, 40, dim, seed=2)) for _ in range(2)]
    q, k, v = _randn(n, heads, dim, seed=3), _randn(n, kv_heads, dim, seed=4), _randn(n, kv_heads, dim, seed=5)
    want = TorchOps(exact=False).cache_attend(q, k, v, *caches[0], start, window)
    got = CAttentionOps().cache_attend(q, k, v, *caches[1], start, window)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(caches[0], caches[1]))


def test_the_ops_rotate_q_and_k_alike_and_leave_v():
    n, heads, kv_heads, dim = 2, 14, 2, 64
    qkv = _randn(n, (heads + 2 * kv_heads) * dim, scale=2.0)
    cos, sin = _randn(n, 1, dim, seed=1), _randn(n, 1, dim, seed=2)
    want = TorchOps().rotary(qkv.clone(), heads + kv_heads, dim, cos, sin)
    rows = qkv.clone()
    got = FusedOps().rotary(rows, heads + kv_heads, dim, cos, sin)
    assert got.shape == want.shape == (n, heads + kv_heads, dim)
    assert ulps_apart(got, want) <= 1 and torch.equal(rows[:, (heads + kv_heads) * dim:],
                                                      qkv[:, (heads + kv_heads) * dim:])
