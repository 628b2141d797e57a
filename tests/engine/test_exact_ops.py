"""The C operations a bf16 ``none`` forward takes while keeping torch's bits (engine.exact_ops):
RMSNorm in torch's sum order, rotary, the paged K/V gather, silu * up. ``none`` must stay
greedy-identical to ``official``, so these tests compare bits, not closeness."""
from __future__ import annotations

import logging

import pytest
import torch

from core.settings import load_settings
from engine import exact_ops, fused
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.kv_cache import ContiguousKVCache, NoCache
from engine.paged.attention import SeqChunk, build_batch
from engine.paged.forward import PagedQwen2
from tests.tiny_model import make_tiny_model_dir

BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def bf16_none(tmp_path_factory):
    """A tiny model whose widths every exact operation accepts (intermediate a multiple of 64)."""
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("exact") / "tiny", intermediate_size=128)
    engine = Engine(load_settings(model=str(folder), dtype="bfloat16", device="cpu", quant="none"))
    yield engine
    engine.close()


@pytest.mark.parametrize("hidden,head_dim", [(896, 64), (64, 16), (200, 24)])
def test_c_rms_norm_and_rotary_reproduce_torch_bit_for_bit_here(hidden, head_dim):
    """(896, 64) is Qwen2.5-0.5B; fresh random rows, not the cached verdict."""
    assert exact_ops.norm_and_rotary_match(hidden, head_dim, seeds=30)


@pytest.mark.parametrize("intermediate", [4864, 128])
def test_c_silu_reproduces_torch_for_every_finite_bf16_gate(intermediate):
    assert exact_ops.silu_matches(intermediate)


def test_silu_widths_with_a_scalar_tail_in_torch_keep_torchs_op():
    assert not exact_ops.silu_matches(136)


def test_a_failing_check_keeps_torchs_op_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(fused, "rotary_", lambda *args: None)   # a C rotary that changed nothing
    with caplog.at_level(logging.INFO, logger="miniserve.engine.exact_ops"):
        ops = exact_ops.check.__wrapped__(896, 64, 4864)
    assert ops == exact_ops.ExactOps(norm_rotary=False, silu=True)
    events = [r for r in caplog.records if r.getMessage() == "exact_c_ops"]
    assert events and events[-1].norm_rotary is False and events[-1].silu is True


def _forward(engine):
    """The engine's forward, fetched on its loop thread (engine state has one owner)."""
    return engine.loop.call(lambda: forward_for(engine))


def test_only_full_precision_bf16_forwards_take_them(bf16_none, tiny_engine):
    forward = _forward(bf16_none)
    assert forward.exact == exact_ops.ExactOps(norm_rotary=True, silu=True) and not forward.fused
    assert not _forward(tiny_engine).exact.any            # float32 keeps torch's ops (MKL's order)


def _with_and_without(engine, forward, run):
    """``run()`` with the exact C operations, then with torch's, on the engine's loop thread (the
    forward's owner); the forward is left as found."""
    ops = forward.exact
    assert ops.norm_rotary and ops.silu

    def both():
        try:
            with_c = run()
            forward.exact = exact_ops.NONE
            return with_c, run()
        finally:
            forward.exact = ops
    return engine.loop.call(both)


def test_contiguous_prefill_and_decode_logits_are_the_same_bits(bf16_none):
    forward = _forward(bf16_none)
    ids = torch.randint(0, forward.config.vocab_size, (13,), generator=torch.Generator().manual_seed(1))

    def run():
        cache = ContiguousKVCache(forward.config, 32, BF16, torch.device("cpu"), exact=True)
        steps = [forward(ids[:9], cache, last_only=False)]
        steps += [forward(ids[i:i + 1], cache) for i in range(9, 13)]
        return torch.cat(steps), forward(ids, NoCache(), last_only=False)

    (cached_c, whole_c), (cached_torch, whole_torch) = _with_and_without(bf16_none, forward, run)
    assert torch.equal(cached_c, cached_torch) and torch.equal(whole_c, whole_torch)


def test_paged_steps_of_several_sequences_are_the_same_bits(bf16_none):
    """A mixed prefill, a decode-only step and a verify-shaped step (1 + 3 tokens beside a decode)."""
    forward = _forward(bf16_none)
    paged = PagedQwen2(forward)
    generator = torch.Generator().manual_seed(2)
    tables = [[3, 5, 7, 1], [2, 4, 6]]
    steps = [[SeqChunk(tables[0], 0, 9), SeqChunk(tables[1], 0, 6)],
             [SeqChunk(tables[0], 9, 1), SeqChunk(tables[1], 6, 1)],
             [SeqChunk(tables[0], 10, 4), SeqChunk(tables[1], 7, 1)]]
    ids = [torch.randint(0, forward.config.vocab_size, (sum(c.num_new for c in s),), generator=generator)
           for s in steps]

    def run():
        pool = paged.make_pool(8, 4)
        logits = [paged.forward(i, build_batch(s, 4), pool, all_logits=True) for i, s in zip(ids, steps)]
        return torch.cat(logits), pool.k.clone(), pool.v.clone()

    with_c, with_torch = _with_and_without(bf16_none, forward, run)
    assert all(torch.equal(a, b) for a, b in zip(with_c, with_torch))


def test_bf16_none_with_them_stays_greedy_identical_to_official(bf16_none):
    from engine.types import GenerationRequest, SamplingParams

    def greedy(method):
        request = GenerationRequest(messages=[{"role": "user", "content": "Tell me about the sea."}],
                                    sampling=SamplingParams(max_new_tokens=12), method=method)
        return bf16_none.generate(request).token_ids

    assert _forward(bf16_none).exact.any
    reference = greedy("official")
    assert all(greedy(method) == reference for method in ("custom_cache", "paged", "prefix_cache"))
