"""The paged KV cache and its scheduler for one loaded model, shared by every caller.

One :class:`PagedService` per engine (``engine.state("paged", ...)``): it owns the block
pool (sized from settings), the block manager and the scheduler, behind one lock.  Any
thread may drive it: :meth:`run_to_completion` steps the scheduler until *its* sequence is
done (the ``paged`` generation method), and :class:`engine.batching.BatchEngine`'s loop
thread steps it for submitted requests.  Every step advances every scheduled sequence,
whoever drives, so requests from both paths share batches.
"""
from __future__ import annotations

import itertools
import logging
import threading
from typing import Any, Callable

from core.logs import log_event
from core.settings import Settings
from engine.batching.scheduler import Scheduler
from engine.batching.sequence import Sequence
from engine.paged.block_manager import BlockManager
from engine.forward import Qwen2Forward
from engine.paged.forward import PagedQwen2
from engine.paged.pool import KVGeometry, blocks_for_budget
from engine.run import GenerationRun
from engine.sampling import Sampler
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
        blocks = num_blocks or pool_blocks(settings, self.runner.geometry, self.runner.dtype)
        self.pool = self.runner.make_pool(blocks, settings.kv_block_size)
        self.blocks = BlockManager(blocks, settings.kv_block_size, prefix_sharing=prefix_sharing)
        self.scheduler = Scheduler(self.runner, self.pool, self.blocks,
                                   max_batch=settings.max_batch,
                                   max_batched_tokens=settings.max_batched_tokens)
        self.lock = threading.RLock()                 # held for each step
        self.wakeup = threading.Event()               # set when a sequence is added
        self._ids = itertools.count(1)
        log_event(logger, "paged_pool_ready", num_blocks=blocks,
                  block_size=settings.kv_block_size, pool_mib=round(self.pool.nbytes / 2**20, 1))

    def new_sequence(self, prompt_ids: list[int], run: GenerationRun, sampling: SamplingParams,
                     penalty: float, on_finish: Callable[[Sequence], None] | None = None) -> Sequence:
        sampler = Sampler(sampling, penalty, self.runner.vocab_size, prompt_ids, self.pool.device)
        return Sequence(seq_id=next(self._ids), prompt_ids=list(prompt_ids), run=run,
                        sampling=sampling, sampler=sampler, on_finish=on_finish)

    def add(self, seq: Sequence) -> None:
        """Thread-safe and never blocks on a running step."""
        self.scheduler.submit(seq)
        self.wakeup.set()

    def step(self) -> int:
        with self.lock:
            return self.scheduler.step()

    def run_to_completion(self, seq: Sequence) -> Sequence:
        """Add ``seq`` and drive the scheduler until it is finished (other sequences in the
        scheduler advance too). Raises the sequence's error, if any."""
        self.add(seq)
        while not seq.finished:
            with self.lock:
                if not seq.finished:
                    self.scheduler.step()
        if seq.error is not None:
            raise seq.error
        return seq

    def stats(self) -> dict[str, Any]:
        """For logs and the monitor: queue sizes, batch figures and block usage."""
        with self.lock:
            s = self.scheduler.stats
            return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                    "batch_size": s.last_batch_size, "max_batch_size": s.max_batch_size,
                    "steps": s.steps, "tokens_computed": s.tokens, "tokens_sampled": s.sampled,
                    "preemptions": s.preemptions, "finished": s.finished,
                    "blocks": self.blocks.stats().to_dict()}


def run_paged(engine: Any, prompt: Any, run: GenerationRun, request: Any, penalty: float) -> int:
    """The ``paged`` generation method (engine method-table signature): one sequence through
    the shared paged scheduler. Returns the prompt tokens found in the block cache."""
    service = paged_service(engine)
    seq = service.new_sequence(prompt.ids, run, request.sampling, penalty)
    service.run_to_completion(seq)
    return seq.cached_tokens or 0


def paged_service(engine: Any) -> PagedService:
    """The engine's one paged service, over the engine's one hand-written forward."""
    from engine.handwritten import forward_for

    return engine.state("paged", lambda: PagedService(forward_for(engine), engine.settings))
