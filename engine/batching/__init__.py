"""Continuous batching over the paged KV cache.

* :mod:`engine.batching.scheduler` - one loop's paged cache (:meth:`Scheduler.for_model`: block
  pool, block manager, scheduler), waiting/running sequences, one batched forward per step
  that returns what it did, chunked prefill, admission by blocks and token budget, preemption
  by recompute.
* :mod:`engine.batching.sequence` - one request inside the scheduler (tokens, progress, run).

Token choice is :mod:`engine.sampling`'s (shared with the single-request methods); the
thread that owns and steps all of this is :class:`engine.loop.EngineLoop`.
"""
from engine.batching.scheduler import Scheduler, StepOutput

__all__ = ["Scheduler", "StepOutput"]
