"""The hand-written forward (:mod:`engine.forward`) over the paged KV cache.

:class:`PagedAttentionCache` implements the forward's ``AttentionCache`` seam for one step
of a batch: the forward runs its linear layers once over the packed new tokens of every
sequence, and per layer hands q/k/v to :func:`paged_attention`, which writes k/v into the
slots the block tables name and attends each sequence over its own blocks.  Only each
sequence's last token goes through the final norm and lm_head (the vocabulary projection is
the biggest matmul).  The model's weights are read in place, never copied.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Protocol

import torch

from engine.forward import Qwen2Forward
from engine.ops.fused_ops import C_MAX_TOKENS
from engine.ops.interface import SmallOps
from engine.ops.torch_ops import EXACT
from engine.quant import q8
from engine.paged.attention import PagedBatch, paged_attention
from engine.paged.pool import KVBlockPool, KVGeometry


class Interrupt(Protocol):
    """What a step asks between layers (engine.batching.arrivals.Interrupt is one): has a
    request come in that outranks ``rank``? A one-call C step reads the int32 at ``address``.
    A protocol here, so the forward does not import the batching layer above it."""

    @property
    def rank(self) -> int: ...

    @property
    def address(self) -> int: ...

    def __call__(self) -> bool: ...


class StepYielded(Exception):
    """The step stopped between layers because ``interrupt`` said so. Nothing it computed is
    kept: the K/V it wrote lie past each sequence's computed tokens and are written again
    when the step runs again."""


class PagedAttentionCache:
    """The ``AttentionCache`` of one step: positions and attention come from ``batch``."""

    def __init__(self, pool: KVBlockPool, batch: PagedBatch, ops: SmallOps = EXACT,
                 interrupt: Callable[[], bool] | None = None):
        """``ops``: the forward's small operations, which write, gather and (in C, for a
        low-bit forward) attend (:func:`engine.paged.attention.paged_attention`).
        ``interrupt``: asked before each layer's attention; True stops the step."""
        self.pool, self.batch, self.ops, self.interrupt = pool, batch, ops, interrupt

    def begin(self, num_new: int) -> torch.Tensor:
        if num_new != self.batch.num_tokens:
            raise ValueError(f"step built for {self.batch.num_tokens} tokens, got {num_new}")
        return self.batch.positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               window: int | None = None) -> torch.Tensor:
        if self.interrupt is not None and self.interrupt():
            raise StepYielded(f"yielded at layer {layer}")
        out = paged_attention(self.pool, layer, self.batch, q, k, v, ops=self.ops, window=window)
        return out.reshape(q.shape[0], -1)

    def commit(self, num_new: int) -> None:
        """Nothing to do: the block manager learns what was computed from the scheduler."""


class PagedQwen2:
    """Runs steps of the hand-written forward whose K/V lives in a :class:`KVBlockPool`."""

    def __init__(self, forward: Qwen2Forward):
        self.forward_model = forward
        cfg = forward.config
        self.geometry = KVGeometry(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        self.vocab_size = cfg.vocab_size

    @property
    def dtype(self) -> torch.dtype:
        return self.forward_model.weights.dtype

    @property
    def device(self) -> torch.device:
        return self.forward_model.weights.device

    def make_pool(self, num_blocks: int, block_size: int) -> KVBlockPool:
        return KVBlockPool(num_blocks, block_size, self.geometry, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, batch: PagedBatch, pool: KVBlockPool,
                all_logits: bool = False, rows: torch.Tensor | None = None,
                decode_only: bool = False, interrupt: Interrupt | None = None) -> torch.Tensor:
        """``input_ids`` ``[n_tokens]`` packed as in ``batch``. Writes their K/V into the pool
        and returns float32 logits ``[batch, vocab]`` of each sequence's last token (or of
        every token with ``all_logits``, or of the packed tokens ``rows`` names: speculative
        verification needs a sequence's last ``1 + drafts`` positions). ``decode_only``: every
        sequence feeds only its newest token (and drafts), no prompt (see engine.quant.q8).
        ``interrupt``: asked between layers (by C in a one-call step); True raises
        :class:`StepYielded`."""
        # a decode-only step of many sequences is compute-bound: q8 may use one-byte activations,
        # in the head too, as bench.quantization --kernels times a step's linears
        # (results/quant_kernels_step.csv: 41.1 ms at 8 rows with two bytes, 28.9 with one)
        if input_ids.shape[0] <= C_MAX_TOKENS:
            if batch.batch_size == 1:
                logits = self._one_call_step(input_ids, batch, pool, all_logits, rows, decode_only, interrupt)
            else:
                logits = self._one_call_batch(input_ids, batch, pool, all_logits, rows, decode_only, interrupt)
            if logits is not None:
                return logits
        with q8.batched_decode() if decode_only else nullcontext():
            forward = self.forward_model
            cache = PagedAttentionCache(pool, batch, forward.ops, interrupt)
            hidden = forward.hidden(input_ids, cache)
            if rows is not None:
                return forward.logits(hidden[rows])
            return forward.logits(hidden if all_logits else hidden[batch.last_index])

    def _one_call_step(self, input_ids: torch.Tensor, batch: PagedBatch, pool: KVBlockPool, all_logits: bool,
                       rows: torch.Tensor | None, decode_only: bool,
                       interrupt: Interrupt | None = None) -> torch.Tensor | None:
        """A lone sequence's step of a few tokens (a decode token, a verify step, a short chunk)
        as one C call (engine.quant.step) where the forward takes it: the same numbers as the
        per-operation path (one-byte activations where q8.batched_decode would choose them).
        None where it does not."""
        forward, n = self.forward_model, input_ids.shape[0]
        step = forward.decode_step
        if step is None or pool.dtype != torch.bfloat16:
            return None
        if rows is not None and not torch.equal(rows, torch.arange(n, device=rows.device)):
            return None
        position = int(batch.positions[0])
        cos, sin = forward.rotary.lookup(position, n)
        head_from = 0 if all_logits or rows is not None else n - 1
        precise = not decode_only or n <= q8.PRECISE_MAX_ROWS
        return _yielding(step, interrupt, forward.weights.embed_tokens(input_ids), pool.k, pool.v, 0,
                         batch.block_tables[0].contiguous(), pool.block_size, position, cos, sin, precise=precise,
                         head_from=head_from)

    def _one_call_batch(self, input_ids: torch.Tensor, batch: PagedBatch, pool: KVBlockPool, all_logits: bool,
                        rows: torch.Tensor | None, decode_only: bool,
                        interrupt: Interrupt | None = None) -> torch.Tensor | None:
        """A decode-only step of several sequences, one token each, as one C call (the step's
        batch form): the same numbers as the per-operation path. None where it does not run."""
        forward, n = self.forward_model, input_ids.shape[0]
        if not decode_only or rows is not None or n != batch.batch_size:
            return None   # drafts to verify, or a prompt's chunk: the per-operation path
        step = forward.decode_step
        if step is None or pool.dtype != torch.bfloat16:
            return None
        cos, sin = forward.rotary.lookup(batch.positions, n)
        return _yielding(step, interrupt, forward.weights.embed_tokens(input_ids), pool.k, pool.v, 0,
                         batch.block_tables, pool.block_size, 0, cos, sin, precise=n <= q8.PRECISE_MAX_ROWS,
                         positions=batch.positions)


def _yielding(step: Callable[..., torch.Tensor | None], interrupt: Interrupt | None, *args: Any,
              **kwargs: Any) -> torch.Tensor:
    """The one-call step, told where to look for an arrival that outranks it (and raising
    :class:`StepYielded` when it stopped for one)."""
    if interrupt is not None:
        kwargs.update(arrived=interrupt.address, rank=interrupt.rank)
    logits = step(*args, **kwargs)
    if logits is None:
        raise StepYielded("yielded inside the one-call step")
    return logits
