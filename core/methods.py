"""The generation methods' names, and which one is batched: spelled here once.

The engine registers a runner under each name (engine/handwritten.py, engine/official.py),
the web validates ``generation_method`` against :data:`GENERATION_METHODS`, and benchmarks
compare them by these names. ``paged`` is the one method the engine loop runs as a batch
(one forward over every running sequence per turn); the others run solo, one token a turn.
"""
from __future__ import annotations

OFFICIAL = "official"
NO_CACHE = "no_cache"
CUSTOM_CACHE = "custom_cache"
PREFIX_CACHE = "prefix_cache"
PAGED = "paged"

BATCHED_METHOD = PAGED
SOLO_METHODS = (OFFICIAL, NO_CACHE, CUSTOM_CACHE, PREFIX_CACHE)
GENERATION_METHODS = (*SOLO_METHODS, BATCHED_METHOD)
