"""The paged forward gives the same logits as transformers' forward, alone and in a batch."""
import pytest
import torch

from engine.paged import BlockManager
from engine.paged.attention import SeqChunk, build_batch
from engine.forward import Qwen2Forward
from engine.paged.forward import PagedQwen2
from engine.weights import fuse_projections
from tests.paged.tiny import tiny_qwen2

BS = 4


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("tie", [False, True])
def test_prefill_logits_match_transformers(tie):
    model = tiny_qwen2(tie=tie)
    runner = PagedQwen2(Qwen2Forward(fuse_projections(model)))
    pool = runner.make_pool(16, BS)
    blocks = BlockManager(16, BS)
    ids = [3, 17, 9, 44, 2, 91, 7, 7, 12, 5, 60]
    blocks.allocate("s", ids)
    batch = build_batch([SeqChunk(blocks.block_table("s"), 0, len(ids))], BS)
    logits = runner.forward(torch.tensor(ids), batch, pool, all_logits=True)
    assert torch.allclose(logits, hf_logits(model, ids), atol=1e-4)


def test_chunked_prefill_and_decode_in_mixed_batches_match_transformers():
    model = tiny_qwen2(seed=1)
    runner = PagedQwen2(Qwen2Forward(fuse_projections(model)))
    pool = runner.make_pool(32, BS)
    blocks = BlockManager(32, BS)
    a = [5, 9, 31, 2, 8, 100, 4, 4, 19]
    b = [77, 6, 1, 54, 3]
    blocks.allocate("a", a)
    blocks.allocate("b", b)
    # step 1: a's first 6 tokens and all of b
    batch = build_batch([SeqChunk(blocks.block_table("a"), 0, 6),
                         SeqChunk(blocks.block_table("b"), 0, 5)], BS)
    out = runner.forward(torch.tensor(a[:6] + b), batch, pool)
    assert torch.allclose(out[1], hf_logits(model, b)[-1], atol=1e-4)
    # step 2: a's remaining 3 tokens (a chunk) and one decode token for b
    b.append(42)
    blocks.append("b", [42])
    batch = build_batch([SeqChunk(blocks.block_table("a"), 6, 3),
                         SeqChunk(blocks.block_table("b"), 5, 1)], BS)
    out = runner.forward(torch.tensor(a[6:] + [42]), batch, pool)
    assert torch.allclose(out[0], hf_logits(model, a)[-1], atol=1e-4)
    assert torch.allclose(out[1], hf_logits(model, b)[-1], atol=1e-4)


def test_logits_match_the_contiguous_cache_step_by_step():
    from engine.kv_cache import ContiguousKVCache

    model = tiny_qwen2(seed=3)
    fwd = Qwen2Forward(fuse_projections(model))
    runner = PagedQwen2(fwd)
    pool = runner.make_pool(16, BS)
    blocks = BlockManager(16, BS)
    contiguous = ContiguousKVCache(fwd.config, 32, fwd.weights.dtype, fwd.weights.device)
    ids = [8, 3, 71, 22, 9, 14, 5]
    blocks.allocate("s", ids)
    batch = build_batch([SeqChunk(blocks.block_table("s"), 0, len(ids))], BS)
    paged = runner.forward(torch.tensor(ids), batch, pool)[0]
    with torch.inference_mode():
        want = fwd(torch.tensor(ids), contiguous)[0]
    assert torch.allclose(paged, want, atol=1e-5)
    for token in (40, 41, 42, 43, 44, 45):            # decode across block boundaries
        blocks.append("s", [token])
        n = blocks.num_tokens("s")
        batch = build_batch([SeqChunk(blocks.block_table("s"), n - 1, 1)], BS)
        paged = runner.forward(torch.tensor([token]), batch, pool)[0]
        with torch.inference_mode():
            want = fwd(torch.tensor([token]), contiguous)[0]
        assert torch.allclose(paged, want, atol=1e-5)
