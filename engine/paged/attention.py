"""Paged attention: write new K/V into the slots a block table names, then attend over each
sequence's blocks with one gather per layer (no concatenation of the history).

A step's tokens are *packed*: the new tokens of every sequence in the batch, sequence after
sequence, ``[n_tokens, ...]``.  The linear layers run on the packed tokens; attention pads the
queries per sequence (``[batch, max_new, heads, dim]``), gathers each sequence's blocks
(``[batch, max_blocks * block_size, kv_heads, dim]``) and masks by position and length, so
prefills, chunks and single decode tokens of different sequences share one forward.
:class:`PagedBatch` is built once per step and used by every layer. The write, the gather and
(for steps of a few tokens per sequence) the attention itself are the forward's small
operations (:mod:`engine.ops`): torch's, or C calls that read the blocks where they lie.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F

from engine.ops.interface import SmallOps
from engine.ops.torch_ops import EXACT
from engine.paged.pool import KVBlockPool
from engine.speculative.attention import MAX_FOLDED_QUERIES, verify_attention


@dataclass(frozen=True)
class SeqChunk:
    """One sequence's part of a step: ``num_new`` tokens starting at position ``start``
    (the ``start`` tokens before them are already in the pool)."""

    block_table: Sequence[int]
    start: int
    num_new: int

    @property
    def end(self) -> int:
        return self.start + self.num_new


@dataclass
class PagedBatch:
    """Per-step metadata shared by all layers (built by :func:`build_batch`)."""

    block_tables: torch.Tensor   # [batch, max_blocks] physical block ids (0-padded)
    slot_mapping: torch.Tensor   # [n_tokens] slot of each packed new token
    positions: torch.Tensor      # [n_tokens] absolute position (for RoPE)
    q_index: torch.Tensor        # [batch, max_new] packed index of each padded query
    q_valid: torch.Tensor        # [batch, max_new] which padded queries are real
    attn_mask: torch.Tensor      # [batch, 1, max_new, max_blocks * block_size] may attend
    last_index: torch.Tensor     # [batch] packed index of each sequence's last new token
    token_rows: torch.Tensor | None = None  # [n_tokens] the sequence (row of block_tables) of each token
    single: tuple[int, int] | None = None  # (context length, start) when batch_size == 1
    slot_split: tuple[torch.Tensor, torch.Tensor] | None = None  # (block, offset) per slot
    _bias: dict | None = field(default=None, repr=False)  # additive masks per dtype, built on first use, shared by the layers

    def bias(self, dtype: torch.dtype) -> torch.Tensor:
        """``attn_mask`` as an additive float mask (0 / -inf) in ``dtype``: converted once per
        step instead of inside every layer's attention call."""
        if self._bias is None:
            self._bias = {}
        if dtype not in self._bias:
            zero = torch.zeros((), dtype=dtype, device=self.attn_mask.device)
            self._bias[dtype] = torch.where(self.attn_mask, zero, float("-inf"))
        return self._bias[dtype]

    def window_bias(self, dtype: torch.dtype, window: int) -> torch.Tensor:
        """:meth:`bias` where each query also sees only its last ``window`` positions (a
        sliding-window layer); padded query rows keep their one key (never all-masked)."""
        key = ("window", dtype, window)
        if self._bias is None:
            self._bias = {}
        if key not in self._bias:
            key_pos = torch.arange(self.attn_mask.shape[-1], device=self.attn_mask.device)
            q_pos = self.positions[self.q_index]                            # [B, Q]
            recent = (key_pos[None, None, :] > (q_pos - window)[:, :, None]) | ~self.q_valid[:, :, None]
            zero = torch.zeros((), dtype=dtype, device=self.attn_mask.device)
            self._bias[key] = torch.where(self.attn_mask & recent[:, None], zero, float("-inf"))
        return self._bias[key]

    def exceeds(self, window: int | None) -> bool:
        """Whether some query of this step is ``window`` or more positions in: only then does a
        sliding window change anything."""
        return window is not None and int(self.positions.max()) >= window

    @property
    def batch_size(self) -> int:
        return self.block_tables.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]


def build_batch(chunks: Sequence[SeqChunk], block_size: int,
                device: str | torch.device = "cpu") -> PagedBatch:
    """Index tensors for one step over ``chunks`` (sequence order = packing order)."""
    if not chunks:
        raise ValueError("a step needs at least one sequence")
    max_blocks = max(-(-c.end // block_size) for c in chunks)
    max_new = max(c.num_new for c in chunks)
    tables = torch.zeros(len(chunks), max_blocks, dtype=torch.long)
    for row, chunk in enumerate(chunks):
        used = -(-chunk.end // block_size)
        tables[row, :used] = torch.as_tensor(list(chunk.block_table[:used]), dtype=torch.long)
    starts = torch.tensor([c.start for c in chunks], dtype=torch.long)
    counts = torch.tensor([c.num_new for c in chunks], dtype=torch.long)
    offsets = torch.cumsum(counts, 0) - counts                     # packed start per sequence
    step = torch.arange(max_new, dtype=torch.long)
    q_valid = step[None, :] < counts[:, None]                      # [B, Q]
    q_pos = starts[:, None] + step[None, :]                        # [B, Q]
    q_index = torch.where(q_valid, offsets[:, None] + step[None, :], 0)
    positions = q_pos[q_valid]                                     # packed, sequence-major
    rows = torch.arange(len(chunks))[:, None].expand_as(q_pos)[q_valid]
    slot_mapping = tables[rows, positions // block_size] * block_size + positions % block_size
    key_pos = torch.arange(max_blocks * block_size, dtype=torch.long)
    # Padded query rows see key 0 only (never all-masked, so no NaN); they are dropped.
    causal_pos = torch.where(q_valid, q_pos, 0)
    mask = key_pos[None, None, :] <= causal_pos[:, :, None]
    return PagedBatch(
        block_tables=tables.to(device), slot_mapping=slot_mapping.to(device),
        positions=positions.to(device), q_index=q_index.to(device),
        q_valid=q_valid.to(device), attn_mask=mask[:, None].to(device),
        last_index=(offsets + counts - 1).to(device), token_rows=rows.to(device),
        single=(chunks[0].end, chunks[0].start) if len(chunks) == 1 else None,
        slot_split=((slot_mapping // block_size).to(device), (slot_mapping % block_size).to(device)))


def paged_attention(pool: KVBlockPool, layer: int, batch: PagedBatch, q: torch.Tensor,
                    k_new: torch.Tensor, v_new: torch.Tensor, scale: float | None = None,
                    ops: SmallOps = EXACT, window: int | None = None) -> torch.Tensor:
    """Store ``k_new``/``v_new`` (``[n_tokens, kv_heads, dim]``) and attend the packed queries
    ``q`` (``[n_tokens, heads, dim]``) over their sequences. Returns ``[n_tokens, heads, dim]``.
    ``ops`` (the forward's, :mod:`engine.ops`) store, gather and, where they have a kernel for
    it (a low-bit forward's C attention), attend a step of a few tokens per sequence reading
    the blocks where they lie. ``window``: a sliding-window layer's window; once a query lies
    beyond it, the step attends through torch with the window's mask."""
    if batch.exceeds(window):
        return _windowed_attention(pool, layer, batch, q, k_new, v_new, scale, window)
    if scale is None:
        out = ops.paged_attend(pool, layer, batch, q, k_new, v_new)
        if out is not None:
            return out
    keys, values, mask = _keys_and_values(pool, layer, batch, q, k_new, v_new, ops)
    if batch.q_index.shape[1] == 1:
        return _decode_attention(q, keys, values, mask, scale)
    if batch.single is None and batch.q_index.shape[1] <= MAX_FOLDED_QUERIES:   # decodes + drafts
        return verify_attention(q, keys, values, mask, scale, batch)
    queries = q[batch.q_index].transpose(1, 2)                     # [B, H, Q, D]
    if batch.single is not None and batch.single[1] == 0:
        out = F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=scale,
                                             enable_gqa=keys.shape[1] != queries.shape[1])
    else:
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale,
                                             enable_gqa=keys.shape[1] != queries.shape[1])
    return out.transpose(1, 2)[batch.q_valid]


def _windowed_attention(pool: KVBlockPool, layer: int, batch: PagedBatch, q: torch.Tensor, k_new: torch.Tensor,
                        v_new: torch.Tensor, scale: float | None, window: int) -> torch.Tensor:
    """Every query over its sequence's last ``window`` positions, one masked SDPA call (over
    keys and values gathered by torch: ``[B, Hkv, T, D]``, every block of the table)."""
    length = batch.block_tables.shape[1] * pool.block_size
    keys, values = EXACT.paged_gather(pool, layer, batch, k_new, v_new, length, q.dtype)
    queries = q[batch.q_index].transpose(1, 2)                     # [B, H, Q, D]
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=batch.window_bias(q.dtype, window),
                                         scale=scale, enable_gqa=keys.shape[1] != queries.shape[1])
    return out.transpose(1, 2)[batch.q_valid]


def _keys_and_values(pool: KVBlockPool, layer: int, batch: PagedBatch, q: torch.Tensor, k_new: torch.Tensor,
                     v_new: torch.Tensor, ops: SmallOps
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Store the new K/V, then each sequence's keys and values ``[B, Hkv, T, D]`` and the mask."""
    mask = batch.bias(q.dtype)
    # One sequence: cut the gathered blocks to its length, so a decode step needs no mask and a
    # fresh prefill is plain causal (SDPA's fast paths).
    length = batch.single[0] if batch.single is not None else batch.block_tables.shape[1] * pool.block_size
    if batch.single is not None:
        mask = None if q.shape[0] == 1 else mask[..., :length]
    keys, values = ops.paged_gather(pool, layer, batch, k_new, v_new, length, q.dtype)
    return keys, values, mask


def _decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      mask: torch.Tensor | None, scale: float | None) -> torch.Tensor:
    """One query per sequence: fold the query heads that share a kv head into the query
    axis (``[B, kv_heads, group, D]``), so keys/values are never repeated per head."""
    batch, kv_heads = keys.shape[0], keys.shape[1]
    heads, dim = q.shape[1], q.shape[2]
    queries = q.view(batch, kv_heads, heads // kv_heads, dim)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(batch, heads, dim)
