"""Continuous batching over the paged KV cache.

* :mod:`engine.batching.scheduler` - waiting/running sequences, one batched forward per step,
  chunked prefill, admission by blocks and token budget, preemption by recompute.
* :mod:`engine.batching.sequence` - one request inside the scheduler (tokens, progress, run).
* :mod:`engine.batching.service` - one loop's block pool + block manager + scheduler.

Token choice is :mod:`engine.sampling`'s (shared with the single-request methods); the
thread that owns and steps all of this is :class:`engine.loop.EngineLoop`.
"""
from engine.batching.service import PagedService

__all__ = ["PagedService"]
