"""The verify-step attention (sequences grouped by query count, heads folded) equals plain
causal attention per sequence, in a batch where some sequences verify drafts and others
decode one token."""
import torch

from engine.paged import BlockManager, KVBlockPool
from engine.paged.attention import SeqChunk, build_batch, paged_attention
from engine.speculative.attention import MAX_FOLDED_QUERIES
from tests.paged.test_paged_attention import BS, GEOM, HEADS, reference


def test_drafting_and_plain_decodes_in_one_batch():
    torch.manual_seed(1)
    pool = KVBlockPool(64, BS, GEOM)
    m = BlockManager(64, BS)
    plan = {"draft5": (11, 5), "one": (7, 1), "draft3": (3, 3), "one_b": (17, 1), "draft5_b": (6, 5)}
    assert max(new for _, new in plan.values()) <= MAX_FOLDED_QUERIES
    history = {}
    for name, (old, new) in plan.items():
        m.allocate(name, list(range(old + new)))
        k, v = torch.randn(old + new, 2, 8), torch.randn(old + new, 2, 8)
        history[name] = (k, v)
        pool.write_layer(0, torch.tensor(m.slots(name, 0, old)), k[:old], v[:old])
    batch = build_batch([SeqChunk(m.block_table(n), old, new) for n, (old, new) in plan.items()], BS)
    q = torch.randn(batch.num_tokens, HEADS, 8)
    k_new = torch.cat([history[n][0][old:] for n, (old, _) in plan.items()])
    v_new = torch.cat([history[n][1][old:] for n, (old, _) in plan.items()])
    out = paged_attention(pool, 0, batch, q, k_new, v_new)
    offset = 0
    for name, (old, new) in plan.items():
        k, v = history[name]
        assert torch.allclose(out[offset:offset + new], reference(q[offset:offset + new], k, v, old),
                              atol=1e-5), name
        offset += new
