"""Speculative decoding inside the paged batching scheduler, one sequence at a time.

The scheduler calls :func:`reserve_drafts` while planning a step (a decoding sequence then
feeds its pending token plus its drafts, and the step's token budget counts them all) and
:func:`settle_drafts` after the batched forward, with that sequence's logit rows.

Block rules: drafts take slots through :meth:`BlockManager.append` like any token, but
only when the pool has room beyond ``spare`` blocks (drafts never cause a preemption);
they are never committed before verification, so a block holding a draft is never hashed
or shared; the rejected ones are cut off with :meth:`BlockManager.truncate` (blocks no
longer needed go back to the free list) before the accepted tokens are committed.
"""
from __future__ import annotations

from typing import Any

import torch

from engine.paged.block_manager import BlockManager
from engine.speculative.acceptance import accept_drafts


def reserve_drafts(seq: Any, blocks: BlockManager, room: int, spare: int) -> list[int]:
    """Propose at most ``room`` drafts for a decoding ``seq`` and give them slots; sets and
    returns ``seq.drafts`` (empty when the sequence does not speculate now)."""
    seq.drafts = []
    if seq.spec is None or room <= 0:
        return seq.drafts
    run = seq.run
    drafts = seq.spec.propose(min(room, run.max_new_tokens - run.produced - 1), seq.tokens)
    while drafts and blocks.append_cost(seq.seq_id, len(drafts)) > blocks.num_available - spare:
        drafts.pop()
    if drafts:
        blocks.append(seq.seq_id, drafts)
    seq.drafts = drafts
    return drafts


def settle_drafts(seq: Any, blocks: BlockManager, rows: torch.Tensor) -> list[int]:
    """After the forward: choose the tokens to emit from ``rows [1 + len(drafts), vocab]``,
    keep the accepted drafts' K/V (commit) and drop the rest (truncate). Returns the
    tokens for the run, in order; the caller appends them to ``seq.tokens``."""
    drafts, seq.drafts = seq.drafts, []
    emitted = accept_drafts(seq.sampler, rows, drafts)
    accepted = len(emitted) - 1
    seq.num_computed += 1 + accepted
    blocks.truncate(seq.seq_id, seq.num_computed)
    blocks.commit(seq.seq_id, seq.num_computed)
    seq.spec.record(len(drafts), accepted)
    seq.run.record_drafts(len(drafts), accepted)
    return emitted
