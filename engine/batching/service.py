"""The paged KV cache and its scheduler for one loaded model.

One :class:`PagedService` per engine loop (:attr:`engine.loop.EngineLoop.paged`, built on the
loop thread): the block pool (sized from settings), the block manager and the scheduler.
Only the loop thread calls it (no lock): every :meth:`step` advances every scheduled sequence.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Callable

from core.logs import log_event
from core.prefix_hash import ROOT_HASH
from core.settings import Settings
from engine.batching.scheduler import Scheduler
from engine.batching.sequence import Sequence
from engine.paged.block_manager import BlockManager
from engine.forward import Qwen2Forward
from engine.paged.forward import PagedQwen2
from engine.paged.pool import KVGeometry, blocks_for_budget
from engine.run import GenerationRun
from engine.sampling import Sampler
from engine.speculative.config import spec_config
from engine.speculative.policy import SpecState
from engine.types import SamplingParams

logger = logging.getLogger("miniserve.engine.paged")


def pool_blocks(settings: Settings, geometry: KVGeometry, dtype: Any) -> int:
    """``kv_memory_mb`` when set, else ``kv_num_blocks``."""
    if settings.kv_memory_mb > 0:
        return blocks_for_budget(settings.kv_memory_mb * 2**20, settings.kv_block_size,
                                 geometry, dtype)
    return settings.kv_num_blocks


class PagedService:
    def __init__(self, forward: Qwen2Forward, settings: Settings, *, num_blocks: int | None = None,
                 prefix_sharing: bool = True):
        self.runner = PagedQwen2(forward)
        self.settings = settings
        blocks = num_blocks or pool_blocks(settings, self.runner.geometry, self.runner.dtype)
        self.pool = self.runner.make_pool(blocks, settings.kv_block_size)
        self.blocks = BlockManager(blocks, settings.kv_block_size, prefix_sharing=prefix_sharing)
        self.scheduler = Scheduler(self.runner, self.pool, self.blocks,
                                   max_batch=settings.max_batch,
                                   max_batched_tokens=settings.max_batched_tokens,
                                   prefill_while_decoding=settings.prefill_tokens_while_decoding,
                                   short_prompt_tokens=settings.short_prompt_tokens)
        self._ids = itertools.count(1)
        log_event(logger, "paged_pool_ready", num_blocks=blocks,
                  block_size=settings.kv_block_size, pool_mib=round(self.pool.nbytes / 2**20, 1))

    def new_sequence(self, prompt_ids: list[int], run: GenerationRun, sampling: SamplingParams,
                     penalty: float, on_finish: Callable[[Sequence], None] | None = None,
                     speculative: bool | None = None, constraint: Any = None,
                     cache_root: int = ROOT_HASH, priority: int = 1) -> Sequence:
        """``speculative``: the request's flag (None: ``MINISERVE_SPECULATIVE`` decides).
        ``constraint``: this sequence's own grammar state (its mask applies to its row only);
        a constrained sequence does not draft (drafts are not checked against the grammar).
        ``cache_root``: its cache salt's chain root (it shares prefix blocks only within it).
        ``priority``: its class rank (0 interactive .. 2 batch): admitted first, preempted last."""
        sampler = Sampler(sampling, penalty, self.runner.vocab_size, prompt_ids, self.pool.device,
                          constraint=constraint, record=run.logprobs, eos_ids=run.eos_ids,
                          resumed=run.token_ids[:run.resumed])
        forward = self.runner.forward_model
        spec = spec_config(self.settings, speculative, forward.weights) if constraint is None else None
        return Sequence(seq_id=next(self._ids), prompt_ids=list(prompt_ids), run=run,
                        sampling=sampling, sampler=sampler, on_finish=on_finish,
                        spec=SpecState.start(spec, prompt_ids) if spec else None, cache_root=cache_root,
                        priority=priority)

    def add(self, seq: Sequence) -> None:
        self.scheduler.submit(seq)

    def step(self) -> int:
        return self.scheduler.step()

    def abort_all(self, error: BaseException) -> None:
        """End every queued or running sequence with ``error`` (the loop is closing)."""
        self.scheduler.abort_all(error)

    def stats(self) -> dict[str, Any]:
        """For logs and the monitor: queue sizes, batch figures and block usage."""
        s = self.scheduler.stats
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                    "batch_size": s.last_batch_size, "max_batch_size": s.max_batch_size,
                "steps": s.steps, "tokens_computed": s.tokens, "tokens_sampled": s.sampled,
                "preemptions": s.preemptions, "finished": s.finished,
                "draft_tokens": s.draft_tokens, "accepted_draft_tokens": s.accepted_draft_tokens,
                "blocks": self.blocks.stats().to_dict(), "block_map": self.blocks.block_map()}

