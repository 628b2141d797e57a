"""The hand-written forward against transformers' Qwen2 on tiny models of several shapes.

Tolerance: float32 logits within 1e-4 absolute of transformers' (observed ~1e-6). In bfloat16
the cached decode steps make the same kinds of kernel calls as transformers (bit for bit on the
CPUs measured), but a fused q/k/v projection is a matmul of another shape, which a CPU's kernels
may round otherwise: bf16 logits are compared within a tolerance and for their top-1 token.
"""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from engine.forward import Qwen2Forward
from engine.kv_cache import ContiguousKVCache, NoCache
from engine.ops.torch_ops import grouped_attention
from engine.weights import fuse_projections
from tests.agreement import top1_agreement
from tests.tiny_model import make_tiny_model_dir

SHAPES = {
    "untied-gqa4:2": {},
    "tied-gqa6:1": {"tie_word_embeddings": True, "hidden_size": 48, "num_heads": 6, "num_kv_heads": 1},
    "mha-headdim24": {"head_dim": 24, "num_heads": 4, "num_kv_heads": 4},
    "gqa8:2-3layers-theta1e6": {"hidden_size": 64, "num_heads": 8, "num_kv_heads": 2, "num_layers": 3,
                                "rope_theta": 1e6},
}
ATOL = 1e-4


@pytest.fixture(scope="module", params=list(SHAPES))
def model_dir(request, tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp(request.param), **SHAPES[request.param])


def _hf_steps(model, ids, split):
    """transformers' logits: one prefill over ids[:split], then one cached step per token."""
    cache = DynamicCache(config=model.config)
    rows = [model(ids[None, :split], cache=cache, use_cache=True).logits[0].float()]
    for i in range(split, ids.shape[0]):
        rows.append(model(ids[None, i:i + 1], cache=cache, use_cache=True).logits[0].float())
    return torch.cat(rows)


def _our_steps(forward, ids, split, dtype):
    cache = ContiguousKVCache(forward.config, 4, dtype, torch.device("cpu"))  # small: exercises growth
    rows = [forward(ids[:split], cache, last_only=False)]
    rows += [forward(ids[i:i + 1], cache) for i in range(split, ids.shape[0])]
    return torch.cat(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_and_every_decode_step_match_transformers(model_dir, dtype):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    ids = torch.randint(0, model.config.vocab_size, (24,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        reference = _hf_steps(model, ids, 16)
        forward = Qwen2Forward(fuse_projections(model))
        ours = _our_steps(forward, ids, 16, dtype)
        full_ref = model(ids[None]).logits[0].float()
        full = forward(ids, NoCache(), last_only=False)
    assert ours.shape == reference.shape == (24, model.config.vocab_size)
    if dtype == torch.float32:
        assert (ours - reference).abs().max().item() < ATOL
        assert (full - full_ref).abs().max().item() < ATOL
    else:
        assert (ours - reference).abs().max().item() < 0.1
        assert top1_agreement(ours, reference) >= 0.9                # a flipped near-tie at most
        assert (full - full_ref).abs().max().item() < 0.1


def test_forward_reads_the_models_own_weights(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.arange(10)[None]

    def storage_bytes():
        return sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                    for p in model.parameters()}.values())

    with torch.inference_mode():
        before = model(ids).logits
        bytes_before = storage_bytes()
        weights = fuse_projections(model)
        again = fuse_projections(model)  # idempotent: same buffers
        after = model(ids).logits
    assert torch.equal(before, after)
    assert storage_bytes() == bytes_before  # nothing held twice
    layer, attn = weights.layers[0], model.model.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == layer.qkv.weight.data_ptr()
    assert attn.k_proj.weight.untyped_storage().data_ptr() == layer.qkv.weight.untyped_storage().data_ptr()
    assert again.layers[0].qkv.weight.data_ptr() == layer.qkv.weight.data_ptr()
    assert weights.embed.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert weights.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    if model.config.tie_word_embeddings:
        assert weights.lm_head.weight.data_ptr() == weights.embed.data_ptr()


def test_prefill_computes_only_the_last_row_by_default(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    forward = Qwen2Forward(fuse_projections(model))
    with torch.inference_mode():
        logits = forward(torch.arange(12), NoCache())
    assert logits.shape == (1, model.config.vocab_size) and logits.dtype == torch.float32


@pytest.mark.parametrize("context", [1, 37, 300])
def test_folded_decode_attention_equals_the_exact_one_in_float32(context):
    """exact=False (quantized weights) folds the query group for a one-token step: the same
    attention, rounded differently (checked in float32); steps of several tokens never fold."""
    gen = torch.Generator().manual_seed(context)
    q = torch.randn(1, 14, 64, generator=gen)
    keys, values = torch.randn(2, context, 64, generator=gen), torch.randn(2, context, 64, generator=gen)
    exact = grouped_attention(q, keys, values, context - 1)
    torch.testing.assert_close(grouped_attention(q, keys, values, context - 1, exact=False), exact,
                               rtol=1e-5, atol=1e-6)
    rows = torch.randn(3, 14, 64, generator=gen)
    many = torch.randn(2, context + 2, 64, generator=gen)
    assert torch.equal(grouped_attention(rows, many, many, context - 1, exact=False),
                       grouped_attention(rows, many, many, context - 1))
