"""The inference engine: model loading, hand-written Qwen2 forward, KV caches, sampling.

Knows nothing of Celery, Flask or Redis: callers pass callbacks for streaming and
cancellation (see :mod:`engine.types`). Importing this package loads nothing heavy:
``Engine`` is imported on first access and the model on first use.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Engine"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from engine.engine import Engine

        return Engine
    raise AttributeError(name)
