"""Attention for verify steps: a few queries per sequence (the pending token + its drafts).

Why not the general paged path: it pads every sequence's queries to the longest one's
(``[batch, heads, Q, dim]``), so when one sequence of a batch of 8 verifies 4 drafts, all 8
attend with 5 queries; on this CPU that tripled the attention time of the step (about 7 ms to
23 ms per step at 400 tokens of context, docs/speculative.md). Here sequences are grouped by
their query count (a step has few distinct counts) and each group attends on its own, with
the query heads that share a kv head folded into the query axis (``[b, kv_heads, Q * group,
dim]``), so no padded query is computed and no kv head is repeated per query head.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

MAX_FOLDED_QUERIES = 16     # a verify step's queries per sequence (1 + k drafts); prefills are longer


def verify_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor | None, scale: float | None, batch: Any) -> torch.Tensor:
    """Packed ``q [n_tokens, H, D]``; ``keys``/``values [B, Hkv, T, D]``; additive ``mask
    [B, 1, Q, T]`` or None (one sequence, cut to its length); ``batch`` a
    :class:`engine.paged.attention.PagedBatch`. Returns ``[n_tokens, H, D]``.

    Every sequence's first query goes through one folded pass over all the keys (no copy,
    like a plain decode step); then the sequences with drafts, grouped by query count,
    attend with all their queries over their own keys (a copy of a few sequences' keys)."""
    out = torch.empty_like(q)
    first = batch.q_index[:, 0]
    first_mask = None if mask is None else mask[:, :, :1]
    out[first] = folded_attention(q[first].unsqueeze(1), keys, values, first_mask, scale).squeeze(1)
    for count, rows in _groups(batch):
        if count == 1:
            continue
        index = batch.q_index[rows, :count]                                  # [b, count]
        every = rows.numel() == keys.shape[0]
        sub_mask = None if mask is None else mask[rows, :, :count]
        out[index.reshape(-1)] = folded_attention(
            q[index], keys if every else keys[rows], values if every else values[rows], sub_mask,
            scale).reshape(-1, q.shape[1], q.shape[2])
    return out


def _groups(batch: Any) -> list[tuple[int, torch.Tensor]]:
    """(query count, rows of the sequences with it), computed once per step."""
    groups = getattr(batch, "_verify_groups", None)
    if groups is None:
        counts = batch.q_valid.sum(dim=1)
        groups = [(int(c), torch.nonzero(counts == c).flatten()) for c in torch.unique(counts).tolist()]
        batch._verify_groups = groups
    return groups


def folded_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor | None, scale: float | None) -> torch.Tensor:
    """``queries [B, Q, H, D]``, ``keys``/``values [B, Hkv, T, D]``, additive ``mask
    [B, 1, Q, T]`` (or None); returns ``[B, Q, H, D]``."""
    batch, num_q, heads, dim = queries.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    folded = queries.reshape(batch, num_q, kv_heads, group, dim).permute(0, 2, 1, 3, 4)
    folded = folded.reshape(batch, kv_heads, num_q * group, dim)
    if mask is not None:
        mask = mask.repeat_interleave(group, dim=2)             # row q*group + g is query q
    out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=scale)
    out = out.reshape(batch, kv_heads, num_q, group, dim).permute(0, 2, 1, 3, 4)
    return out.reshape(batch, num_q, heads, dim)
