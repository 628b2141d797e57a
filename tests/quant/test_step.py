"""The one-call q8 decode step (engine/quant/step.py, native/step.c) against the fused Python
forward it replaces: the same C pieces in the same order, so the same logits bit for bit."""
from __future__ import annotations

import pytest
import torch

from core.settings import load_settings
from engine.engine import Engine
from engine.forward import Qwen2Forward
from engine.kv_cache import ContiguousKVCache
from engine.ops.fused_ops import CAttentionOps, FusedOps
from engine.quant import q8
from engine.quant.model import quantize_weights
from engine.quant.step import DecodeStep
from engine.weights import fuse_projections

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 128, 11]


def _snap_to_five_bits(weight: torch.Tensor) -> None:
    """Put each group of 32 inputs on a Q5_0 grid (d * (-16..15), d in fp16, -16 d present), so
    that q8 stores the layer in 5 bits (q5) where the CPU packs them."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // 32, 32)
    d = (groups.abs().amax(-1, keepdim=True) / 16).clamp_min(1e-3).half().float()
    codes = torch.round(groups / d).clamp(-15, 15)
    codes[..., :1] = -16                  # the group's extreme, negative: no sign flip
    weight.copy_((codes * d).reshape(n, k).to(weight.dtype))


def _q8_forward(model_dir, five_bits: bool = False) -> Qwen2Forward:
    engine = Engine(load_settings(model=str(model_dir), dtype="bfloat16", device="cpu", quant="none"))
    weights = fuse_projections(engine.loaded.model)
    if five_bits:
        for layer in weights.layers:
            for projection in (layer.qkv, layer.o, layer.gate_up, layer.down):
                _snap_to_five_bits(projection.weight)
    quantized, _ = quantize_weights(weights, "q8")
    return Qwen2Forward(quantized, ops=CAttentionOps())   # the C attention (and so the step) on any CPU


def _decode(forward: Qwen2Forward, one_call: bool, tokens: list[int], capacity: int):
    """Prefill PROMPT, then feed ``tokens`` one at a time; every step's logits and the cache."""
    forward.one_call_step = one_call
    cfg = forward.config
    cache = ContiguousKVCache(cfg, capacity, torch.bfloat16, torch.device("cpu"), ops=forward.ops)
    with torch.inference_mode():
        steps = [forward(torch.tensor(PROMPT), cache)]
        for token in tokens:
            steps.append(forward(torch.tensor([token]), cache))
    return steps, cache


@pytest.mark.parametrize("five_bits", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_one_call_step_equals_the_fused_forward_bit_for_bit(quant_model_dir, five_bits, threads):
    forward = _q8_forward(quant_model_dir, five_bits)
    modes = {layer.qkv.mode for layer in forward.weights.layers}
    assert modes == ({"q5"} if five_bits and q8.packs_five_bits() else {"q8"})
    assert_one_call_equals_per_operation(forward, threads)


def assert_one_call_equals_per_operation(forward: Qwen2Forward, threads: int) -> None:
    """A prefill and 8 decode steps with and without the one-call step: equal logits and cache."""
    assert forward.decode_step is not None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tokens = [1, 300, 77, 2, 45, 45, 9, 380]
        # capacity below the prompt + tokens: the cache grows in the middle of the decode
        want, want_cache = _decode(forward, False, tokens, capacity=12)
        got, got_cache = _decode(forward, True, tokens, capacity=12)
    finally:
        torch.set_num_threads(before)
    for step, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == torch.float32 and g.shape == w.shape, step
        assert torch.equal(g, w), f"step {step}: logits differ by {(g - w).abs().max()}"
    assert got_cache.length == want_cache.length == len(PROMPT) + len(tokens)
    end = got_cache.length
    assert torch.equal(got_cache.k[:, :, :end], want_cache.k[:, :, :end])
    assert torch.equal(got_cache.v[:, :, :end], want_cache.v[:, :, :end])


def test_a_verify_step_gives_every_row_the_same_logits(quant_model_dir):
    """Several tokens with logits for each (a verify step: the pending token and its drafts),
    after a prompt longer than a step (prefilled by torch's attention either way)."""
    forward = _q8_forward(quant_model_dir)
    cfg = forward.config
    prompt = torch.tensor(PROMPT * 3)                            # 30 tokens: not a step
    results = {}
    for one_call in (False, True):
        forward.one_call_step = one_call
        cache = ContiguousKVCache(cfg, 64, torch.bfloat16, torch.device("cpu"), ops=forward.ops)
        with torch.inference_mode():
            forward(prompt, cache)
            results[one_call] = forward(torch.tensor([4, 8, 15, 16, 23]), cache, last_only=False), cache
    (got, got_cache), (want, want_cache) = results[True], results[False]
    assert got.shape == (5, cfg.vocab_size) and torch.equal(got, want)
    assert torch.equal(got_cache.k[:, :, :35], want_cache.k[:, :, :35])


def test_the_step_is_taken_only_where_every_piece_runs_in_c(quant_model_dir):
    engine = Engine(load_settings(model=str(quant_model_dir), dtype="bfloat16", device="cpu", quant="none"))
    weights = fuse_projections(engine.loaded.model)
    assert not DecodeStep.supports(weights)                     # bf16 projections: torch's linears
    forward = _q8_forward(quant_model_dir)
    assert forward.decode_step is not None
    forward.ops = FusedOps()                                    # attention stays torch's (AVX2 CPUs)
    assert forward.decode_step is None
    forward.ops, forward.one_call_step = CAttentionOps(), False  # turned off by a test
    assert forward.decode_step is None


def test_the_step_runs_in_generation(quant_model_dir, monkeypatch):
    """custom_cache decoding goes through the step (counted), with the same tokens as without."""
    forward = _q8_forward(quant_model_dir)
    step = forward.decode_step
    calls = []
    original = DecodeStep.__call__
    monkeypatch.setattr(DecodeStep, "__call__", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    cfg = forward.config

    def greedy(one_call: bool) -> list[int]:
        forward.one_call_step = one_call
        cache = ContiguousKVCache(cfg, 64, torch.bfloat16, torch.device("cpu"), ops=forward.ops)
        out, ids = [], torch.tensor(PROMPT)
        with torch.inference_mode():
            for _ in range(10):
                token = int(forward(ids, cache).argmax())
                out.append(token)
                ids = torch.tensor([token])
        return out

    assert greedy(False) == greedy(True)
    assert step is forward.decode_step and len(calls) == 10     # the 10-token prefill and every step


@pytest.mark.parametrize("method,speculative", [("custom_cache", False), ("prefix_cache", False), ("paged", False),
                                                ("custom_cache", True), ("paged", True)])
def test_methods_decode_through_the_step_with_the_same_tokens(quant_model_dir, tmp_path, monkeypatch, method,
                                                              speculative):
    """A q8 engine's one-token steps take the step (a lone paged sequence too), and its greedy
    tokens are those of the per-operation path. A fresh engine each: a second request would
    reuse the first one's prefix (prefix_cache, paged sharing) and prefill differently."""
    from engine.handwritten import forward_for
    from engine.types import GenerationRequest, SamplingParams

    calls, drafted = [], []
    original = DecodeStep.__call__
    monkeypatch.setattr(DecodeStep, "__call__", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    # speculative: verify steps of the pending token and up to 6 drafts (one-byte activations
    # in a paged verify step of more than 4 rows, as q8.batched_decode chooses)
    request = GenerationRequest(messages=[{"role": "user", "content": "Write a short poem about the sea."}],
                                method=method, sampling=SamplingParams(max_new_tokens=24, temperature=0.0),
                                speculative=speculative)

    def tokens(one_call: bool) -> list[int]:
        engine = Engine(load_settings(model=str(quant_model_dir), device="cpu", dtype="bfloat16", quant="q8",
                                      cache_dir=tmp_path, spec_tokens=6, spec_ngram=(2, 1))).load()
        try:
            forward = engine.loop.call(lambda: forward_for(engine))
            engine.loop.call(lambda: (setattr(forward, "ops", CAttentionOps()), setattr(forward, "one_call_step", one_call)))
            result = engine.generate(request)
            drafted.append(result.usage.draft_tokens)
            return result.token_ids
        finally:
            engine.close()

    per_operation = tokens(False)
    assert not calls
    one_call = tokens(True)
    assert one_call == per_operation
    assert drafted[0] == drafted[1] and (drafted[0] > 0) == speculative
    if not speculative:
        assert len(calls) == len(one_call) - 1 > 0               # every token after the prefill's
    assert calls


@pytest.mark.parametrize("drafts", [3, 7])
def test_a_paged_verify_step_equals_the_per_operation_path(quant_model_dir, drafts):
    """A lone paged sequence's verify step (decode-only, logits for every row): two-byte
    activations up to 4 rows, one byte beyond (q8.batched_decode's rule), in the step as in
    the per-operation path; the pool's blocks end the same."""
    from engine.paged.attention import SeqChunk, build_batch
    from engine.paged.forward import PagedQwen2

    forward = _q8_forward(quant_model_dir)
    model = PagedQwen2(forward)
    prompt, step_ids = PROMPT * 3, [4, 8, 15, 16, 23, 42, 7, 9][:drafts + 1]
    table = [2, 0, 3]                                             # blocks of 16: 30 + 8 tokens
    results = {}
    for one_call in (False, True):
        forward.one_call_step = one_call
        pool = model.make_pool(num_blocks=4, block_size=16)
        model.forward(torch.tensor(prompt), build_batch([SeqChunk(table, 0, len(prompt))], 16), pool)
        n = len(step_ids)
        batch = build_batch([SeqChunk(table, len(prompt), n)], 16)
        logits = model.forward(torch.tensor(step_ids), batch, pool, rows=torch.arange(n), decode_only=True)
        results[one_call] = logits, pool
    (got, got_pool), (want, want_pool) = results[True], results[False]
    assert got.shape == (drafts + 1, forward.config.vocab_size) and torch.equal(got, want)
    assert torch.equal(got_pool.k, want_pool.k) and torch.equal(got_pool.v, want_pool.v)


def _decode_batch(model, forward, one_call: bool, count: int, interrupt=None):
    """``count`` sequences of different lengths and block tables prefilled one by one, then
    one decode-only step of all of them: its logits and the pool."""
    from engine.paged.attention import SeqChunk, build_batch

    forward.one_call_step = one_call
    pool = model.make_pool(num_blocks=4 * count, block_size=8)
    tables = [[4 * i + 3, 4 * i + 1, 4 * i + 2, 4 * i] for i in range(count)]   # out of order
    prompts = [(PROMPT * 3)[:12 + 3 * i] for i in range(count)]                    # 12..: 2-4 blocks
    for table, prompt in zip(tables, prompts):
        model.forward(torch.tensor(prompt), build_batch([SeqChunk(table, 0, len(prompt))], 8), pool)
    batch = build_batch([SeqChunk(table, len(prompt), 1) for table, prompt in zip(tables, prompts)], 8)
    logits = model.forward(torch.tensor([7 + i for i in range(count)]), batch, pool, decode_only=True,
                           interrupt=interrupt)
    return logits, pool


@pytest.mark.parametrize("count", [2, 6])   # 6 rows: one-byte activations (q8.batched_decode's rule)
def test_a_paged_decode_batch_in_one_call_equals_the_per_operation_path(quant_model_dir, monkeypatch, count):
    from engine.paged.forward import PagedQwen2

    forward = _q8_forward(quant_model_dir)
    model = PagedQwen2(forward)
    calls = []   # per call: whether it was a batch (positions given)
    original = DecodeStep.__call__
    monkeypatch.setattr(DecodeStep, "__call__",
                        lambda self, *a, **k: calls.append(k.get("positions") is not None) or original(self, *a, **k))
    want, want_pool = _decode_batch(model, forward, False, count)
    got, got_pool = _decode_batch(model, forward, True, count)
    assert calls.count(True) == 1                                 # the batch step went through C
    assert got.shape == (count, forward.config.vocab_size) and torch.equal(got, want)
    assert torch.equal(got_pool.k, want_pool.k) and torch.equal(got_pool.v, want_pool.v)


def test_the_one_call_step_stops_for_a_better_class_and_keeps_going_for_others(quant_model_dir):
    """The flag C reads before each layer (engine.batching.arrivals): an interactive request on
    its way in stops a batch-class step (StepYielded); one of the step's own class does not."""
    from engine.batching.arrivals import Arrivals, Interrupt
    from engine.paged.forward import PagedQwen2, StepYielded

    forward = _q8_forward(quant_model_dir)
    model = PagedQwen2(forward)
    arrivals = Arrivals()
    arrivals.came(2)
    want, _ = _decode_batch(model, forward, True, 3)
    got, _ = _decode_batch(model, forward, True, 3, interrupt=Interrupt(arrivals, rank=2))
    assert torch.equal(got, want)
    arrivals.came(0)
    with pytest.raises(StepYielded):
        _decode_batch(model, forward, True, 3, interrupt=Interrupt(arrivals, rank=2))
