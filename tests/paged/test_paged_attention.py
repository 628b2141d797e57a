"""Paged attention over a mixed batch equals plain causal attention per sequence."""
import torch
import torch.nn.functional as F

from engine.paged import BlockManager, KVBlockPool, KVGeometry
from engine.paged.attention import SeqChunk, build_batch, paged_attention

GEOM = KVGeometry(num_layers=2, num_kv_heads=2, head_dim=8)
HEADS, BS = 4, 4


def reference(q, k, v, start):
    """Causal attention of queries at positions start.. over keys 0..start+len(q)-1."""
    k = k.repeat_interleave(HEADS // GEOM.num_kv_heads, 1)
    v = v.repeat_interleave(HEADS // GEOM.num_kv_heads, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / GEOM.head_dim ** 0.5
    q_pos = torch.arange(start, start + q.shape[0])[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[0])[None] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v)


def test_mixed_prefill_chunk_and_decode_in_one_batch():
    torch.manual_seed(0)
    pool = KVBlockPool(32, BS, GEOM)
    m = BlockManager(32, BS)
    # (history already stored, new tokens this step): a fresh prefill, a second chunk,
    # two single-token decodes of different lengths.
    plan = {"p": (0, 9), "c": (5, 6), "d1": (13, 1), "d2": (2, 1)}
    history = {}
    for name, (old, new) in plan.items():
        m.allocate(name, list(range(old + new)))
        k = torch.randn(old + new, 2, 8)
        v = torch.randn(old + new, 2, 8)
        history[name] = (k, v)
        if old:
            slots = torch.tensor(m.slots(name, 0, old))
            pool.write_layer(1, slots, k[:old], v[:old])
    chunks = [SeqChunk(m.block_table(n), old, new) for n, (old, new) in plan.items()]
    batch = build_batch(chunks, BS)
    assert batch.num_tokens == 9 + 6 + 1 + 1 and batch.batch_size == 4
    q = torch.randn(batch.num_tokens, HEADS, 8)
    k_new = torch.cat([history[n][0][old:] for n, (old, _) in plan.items()])
    v_new = torch.cat([history[n][1][old:] for n, (old, _) in plan.items()])
    out = paged_attention(pool, 1, batch, q, k_new, v_new)
    offset = 0
    for name, (old, new) in plan.items():
        k, v = history[name]
        expected = reference(q[offset:offset + new], k, v, old)
        assert torch.allclose(out[offset:offset + new], expected, atol=1e-5), name
        offset += new
    assert batch.last_index.tolist() == [8, 14, 15, 16]
    assert batch.positions[:3].tolist() == [0, 1, 2] and batch.positions[9].item() == 5


def test_slot_mapping_follows_block_table():
    chunks = [SeqChunk([7, 3], 3, 2)]
    batch = build_batch(chunks, BS)
    assert batch.slot_mapping.tolist() == [7 * BS + 3, 3 * BS + 0]


def test_single_sequence_fast_paths_match_reference():
    torch.manual_seed(1)
    for old, new in ((0, 7), (6, 3), (9, 1)):       # fresh prefill, chunk, decode
        pool = KVBlockPool(8, BS, GEOM)
        m = BlockManager(8, BS)
        m.allocate("s", list(range(old + new)))
        k, v = torch.randn(old + new, 2, 8), torch.randn(old + new, 2, 8)
        if old:
            pool.write_layer(0, torch.tensor(m.slots("s", 0, old)), k[:old], v[:old])
        batch = build_batch([SeqChunk(m.block_table("s"), old, new)], BS)
        q = torch.randn(new, HEADS, 8)
        out = paged_attention(pool, 0, batch, q, k[old:], v[old:])
        assert torch.allclose(out, reference(q, k, v, old), atol=1e-5), (old, new)


def test_decode_only_batch_of_different_lengths():
    torch.manual_seed(2)
    pool = KVBlockPool(32, BS, GEOM)
    m = BlockManager(32, BS)
    lengths = {"a": 1, "b": 6, "c": 13}
    hist = {}
    for name, n in lengths.items():
        m.allocate(name, list(range(n)))
        k, v = torch.randn(n, 2, 8), torch.randn(n, 2, 8)
        hist[name] = (k, v)
        if n > 1:
            pool.write_layer(0, torch.tensor(m.slots(name, 0, n - 1)), k[:-1], v[:-1])
    batch = build_batch([SeqChunk(m.block_table(x), n - 1, 1) for x, n in lengths.items()], BS)
    q = torch.randn(3, HEADS, 8)
    out = paged_attention(pool, 0, batch, q, torch.stack([hist[x][0][-1] for x in lengths]),
                          torch.stack([hist[x][1][-1] for x in lengths]))
    for row, (name, n) in enumerate(lengths.items()):
        k, v = hist[name]
        assert torch.allclose(out[row:row + 1], reference(q[row:row + 1], k, v, n - 1), atol=1e-5)
