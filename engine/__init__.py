"""The inference engine: model loading, hand-written Qwen2 forward, KV caches, sampling.

Knows nothing of Celery, Flask or Redis: callers pass callbacks for streaming and
cancellation (see :mod:`engine.types`). The package re-exports nothing (``Engine`` lives in
:mod:`engine.engine`): importing ``engine.ops.c_calls`` must not import the loop above it.
"""
