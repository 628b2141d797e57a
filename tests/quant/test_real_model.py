"""Quantization on the real default model (slow: ~1 minute; run under the heavy-run lock)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from bench.quantization_quality import teacher_forced
from core.settings import load_settings
from engine.engine import Engine
from engine.forward import Qwen2Forward
from engine.quant import q8
from engine.quant.model import as_plan, quantized_or_cached
from engine.types import GenerationRequest, SamplingParams
from engine.weights import fuse_projections
from tests.agreement import common_prefix

PROMPTS = ["Write a Python function that reverses a string.", "用一句话介绍一下长城。"]
# q8 (the CPU default): 0.995 against none in bench.quantization (8 prompts x 32 tokens), 0.968
# here against official (2 prompts).
MIN_AGREEMENT = 0.95
# quantized bytes / bf16 bytes of the projections and lm_head (q8 also counts its embedding,
# 5-bit packed)
MAX_BYTES = 0.58
MAX_BYTES_Q8_WITHOUT_FIVE_BITS = 0.66   # AVX2: the Q5_0 tensors stay 8-bit (q8.FIVE_BIT_PATHS)


@pytest.fixture(scope="module")
def real():
    engine = Engine(load_settings(model="default", device="cpu", dtype="bfloat16", quant="none"))
    weights = fuse_projections(engine.loaded.model)
    sampling = SamplingParams(max_new_tokens=16, repetition_penalty=1.0)
    requests = [GenerationRequest(messages=[{"role": "user", "content": p}], sampling=sampling,
                                  method="official") for p in PROMPTS]
    reference = [engine.generate(r).token_ids for r in requests]
    yield engine, weights, requests, reference
    engine.close()  # the loop thread would keep the model alive for the rest of the suite


def parameter_digests(model) -> list[tuple[str, int, str]]:
    """Each parameter's name, address and a digest of its bytes (no copy of the model)."""
    return [(name, p.data_ptr(), hashlib.blake2b(p.detach().contiguous().view(torch.uint8).numpy()).hexdigest())
            for name, p in model.named_parameters()]


@pytest.fixture(scope="module")
def q8_weights(real):
    """The default model's q8 weights as a worker's start gets them (quantized from the folder's
    stored values, or read back from the weight cache an earlier q8 start of this suite wrote:
    quantizing takes ~30 s on a 2-core AVX2 host), and the official model's parameter digests
    from before."""
    engine, weights, _, _ = real
    before = parameter_digests(engine.loaded.model)
    cache = Path(load_settings(model="default").cache_dir) / "quantized"
    quantized, summary = quantized_or_cached(weights, as_plan("q8"), engine.loaded.path, cache)
    return quantized, summary, before


@pytest.mark.slow
def test_q8_default_model_agrees_with_bf16(real, q8_weights):
    engine, weights, requests, reference = real
    quantized, summary, official_before = q8_weights
    assert summary.layers == 24 * 4 + 1
    limit = MAX_BYTES if q8.packs_five_bits() else MAX_BYTES_Q8_WITHOUT_FIVE_BITS
    assert summary.quantized_bytes < limit * summary.reference_bytes
    prompts = [engine.prompt(r).ids for r in requests]
    agreement = teacher_forced(Qwen2Forward(quantized), prompts, reference)
    assert agreement >= MIN_AGREEMENT, agreement
    # official's model is untouched by quantization: the same tensors at the same addresses
    # (cheaper than generating its references again, and what that would have shown)
    assert parameter_digests(engine.loaded.model) == official_before


@pytest.mark.slow
def test_q8_holds_the_ggufs_q5_0_tensors_exactly_in_five_bits(real, q8_weights):
    """From the stored float32 values (engine.quant.source) the default model's Q5_0 tensors
    (gate/up, o, the embedding, q/k/v where v is Q5_0 too) come back bit for bit, packed in 5
    bits; down (Q4_K/Q6_K) and lm_head (Q8_0) stay 8-bit."""
    from engine.quant.source import StoredWeights

    engine, _, _, _ = real
    quantized, _, _ = q8_weights
    modes = {p: {getattr(layer, p).mode for layer in quantized.layers} for p in ("qkv", "o", "gate_up", "down")}
    five = "q5" if q8.packs_five_bits() else "q8"   # 5-bit storage only where it reads faster
    assert modes == {"qkv": {five, "q8"}, "o": {five}, "gate_up": {five}, "down": {"q8"}}
    assert quantized.lm_head.mode == "q8" and quantized.embed.packed5
    with StoredWeights(engine.loaded.path) as stored:
        assert (quantized.layers[3].gate_up.dequantize() == stored.projection(3, "gate_up")).all()
        ids = __import__("torch").tensor([0, 1000, 151000])
        table = stored.tensor("model.embed_tokens.weight")
        assert (quantized.embed.lookup(ids).float() == table[ids].to(quantized.embed.dtype).float()).all()


@pytest.mark.slow
def test_q8_paged_decode_in_c_gives_the_tokens_of_the_contiguous_cache():
    """Under q8 both caches decode with the same C attention (engine.ops): the paged one
    reads the block table, the contiguous one its buffer. One request's greedy tokens agree
    (exactly on the CPUs measured; low-bit results of two code paths are held to a floor);
    the mapped embedding and the fused forward are what a worker runs."""
    engine = Engine(load_settings(model="default", device="cpu", dtype="bfloat16", quant="q8"))
    try:
        sampling = SamplingParams(max_new_tokens=24, repetition_penalty=1.0)
        for prompt in PROMPTS:
            runs = {method: engine.generate(GenerationRequest(messages=[{"role": "user", "content": prompt}],
                                                              sampling=sampling, method=method)).token_ids
                    for method in ("custom_cache", "paged")}
            assert common_prefix(runs["custom_cache"], runs["paged"]) >= 12, runs  # of 24
        assert engine.info()["quant"] == "q8"
    finally:
        engine.close()
