"""Speculative decoding inside the paged batching scheduler, one sequence at a time.

The scheduler calls :func:`reserve_drafts` while planning a step, once for all its decoding sequences (each
then feeds its pending token plus its drafts; the step's token budget counts them all, and
drafts are shared out by expected value, :mod:`engine.speculative.budget`) and
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
from engine.speculative.budget import choose_drafts


def reserve_drafts(seqs: list[Any], blocks: BlockManager, room: int, spare: int) -> int:
    """Give the decoding ``seqs`` of one step their drafts: each speculating sequence
    proposes, :func:`choose_drafts` shares the ``room`` left in the token budget by expected
    value, and the chosen drafts get slots. Sets every ``seq.drafts``; returns their total."""
    for seq in seqs:
        seq.drafts = []
    speculating = [seq for seq in seqs if seq.spec is not None]
    if not speculating or room <= 0:
        return 0
    proposals = [seq.spec.propose(min(room, seq.run.max_new_tokens - seq.run.produced - 1), seq.tokens)
                 for seq in speculating]
    counts = choose_drafts([p.chances for p in proposals], len(seqs), speculating[0].spec.config, room)
    total = 0
    for seq, proposal, count in zip(speculating, proposals, counts):
        drafts = seq.spec.begin(proposal, count)
        while drafts and blocks.append_cost(seq.seq_id, len(drafts)) > blocks.num_available - spare:
            drafts.pop()
        if drafts:
            blocks.append(seq.seq_id, drafts)
        seq.drafts = drafts
        total += len(drafts)
    return total


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
