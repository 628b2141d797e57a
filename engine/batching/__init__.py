"""Continuous batching over the paged KV cache.

* :mod:`engine.batching.scheduler` - waiting/running sequences, one batched forward per step,
  chunked prefill, admission by blocks and token budget, preemption by recompute.
* :mod:`engine.batching.sampling` - per-sequence next-token choice.
* :mod:`engine.batching.service` - the per-engine pool + scheduler + lock, and the ``paged``
  generation method.
* :mod:`engine.batching.batch_engine` - ``BatchEngine.submit(request, on_text, should_cancel)
  -> Future[GenerationResult]`` with an engine loop thread, for the worker.
"""
from engine.batching.batch_engine import BatchEngine
from engine.batching.service import PagedService, paged_service, run_paged

__all__ = ["BatchEngine", "PagedService", "paged_service", "run_paged"]
