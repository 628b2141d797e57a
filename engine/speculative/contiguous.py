"""Speculative decoding over one sequence's contiguous KV cache (``custom_cache`` and
``prefix_cache``).

Each step feeds the last emitted token plus the drafts through ONE forward (the cache then
holds all of them), lets :func:`accept_drafts` choose what to emit, cuts the cache back to
the tokens that are now final (:meth:`ContiguousKVCache.truncate`) and hands the emitted
tokens to the run one at a time, stopping at the first stop condition. Nothing is streamed
that is later taken back: only accepted tokens ever reach the run.
"""
from __future__ import annotations

import torch

from engine.forward import Qwen2Forward
from engine.kv_cache import ContiguousKVCache
from engine.run import GenerationRun
from engine.sampling import Sampler
from engine.speculative.acceptance import accept_drafts
from engine.speculative.budget import choose_drafts
from engine.speculative.policy import SpecState


def speculative_decode_loop(forward: Qwen2Forward, cache: ContiguousKVCache, logits: torch.Tensor,
                            sampler: Sampler, run: GenerationRun, state: SpecState) -> None:
    """Like :func:`engine.handwritten.decode_loop`, verifying drafts in each forward."""
    device = forward.weights.device
    emitted = [sampler(logits)]
    while True:
        for token in emitted:
            if run.accept(token):
                return
            state.push(token)
        token = emitted[-1]
        # drafts beyond what max tokens allows would be verified for nothing
        proposal = state.propose(run.max_new_tokens - run.produced - 1)
        drafts = state.begin(proposal, choose_drafts([proposal.chances], 1, state.config, len(proposal.tokens))[0])
        base = cache.length
        ids = torch.tensor([token, *drafts], dtype=torch.long, device=device)
        logits = forward(ids, cache, last_only=not drafts)
        if not drafts:
            emitted = [sampler(logits)]
            continue
        emitted = accept_drafts(sampler, logits, drafts)
        cache.truncate(base + len(emitted))       # the fed token + the accepted drafts
        state.record(len(drafts), len(emitted) - 1)
        run.record_drafts(len(drafts), len(emitted) - 1)
