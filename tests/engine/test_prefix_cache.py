"""PrefixCache: LRU order, entry and token budgets, eviction, stats, entries never mutated."""
from __future__ import annotations

import torch

from core.settings import load_settings
from engine.engine import Engine
from engine.prefix_cache import PrefixCache
from engine.types import GenerationRequest, SamplingParams


def _kv(tokens, fill=1.0):
    shape = (2, 2, tokens, 4)
    return torch.full(shape, fill), torch.full(shape, -fill)


def test_lru_order_and_entry_budget():
    cache = PrefixCache(max_entries=2, max_tokens=100)
    cache.put([1], *_kv(3))
    cache.put([2], *_kv(3))
    assert cache.get([1]) is not None  # 1 becomes most recent
    cache.put([3], *_kv(3))  # evicts 2, the least recently used
    assert cache.keys() == [(1,), (3,)]
    assert cache.get([2]) is None
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["evictions"], stats["entries"]) == (1, 1, 1, 2)
    assert stats["cached_tokens"] == 6 and stats["bytes"] == 2 * 2 * (2 * 2 * 3 * 4) * 4


def test_token_budget_evicts_until_it_fits_and_rejects_oversized():
    cache = PrefixCache(max_entries=10, max_tokens=10)
    cache.put([1], *_kv(4))
    cache.put([2], *_kv(4))
    cache.put([3], *_kv(5))  # 13 > 10: evict 1 -> 9
    assert cache.keys() == [(2,), (3,)] and cache.stats()["cached_tokens"] == 9
    assert not cache.put([4], *_kv(11))
    assert cache.stats()["rejected"] == 1 and len(cache) == 2
    cache.put([2], *_kv(2))  # replacing an entry updates the token count
    assert cache.stats()["cached_tokens"] == 7 and cache.keys() == [(3,), (2,)]


def test_engine_prefix_cache_hit_never_mutates_the_entry_and_budget_applies(tiny_model_dir):
    engine = Engine(load_settings(model=str(tiny_model_dir), dtype="float32", quant="none", prefix_cache_max_entries=2,
                                  prefix_cache_max_tokens=10_000))

    def run(prefix, question="q"):
        return engine.generate(GenerationRequest(messages=[{"role": "user", "content": question}], prefix=prefix,
                                                 method="prefix_cache", sampling=SamplingParams(max_new_tokens=12)))

    first = run("system A")
    store = engine.loop.call(lambda: engine.state("prefix_cache", lambda: None))
    (key,) = store.keys()
    entry = engine.loop.call(lambda: store.get(key))
    snapshot = (entry.keys.clone(), entry.values.clone())
    second = run("system A", "another question")
    third = run("system A")
    assert second.usage.cached_tokens == third.usage.cached_tokens == len(key) and first.usage.cached_tokens == 0
    assert third.token_ids == first.token_ids
    assert torch.equal(entry.keys, snapshot[0]) and torch.equal(entry.values, snapshot[1])
    run("system B")
    run("system C")  # third distinct prefix: A (least recent) is evicted
    stats = engine.stats()["prefix_cache"]
    assert stats["entries"] == 2 and stats["evictions"] == 1 and key not in store
    assert stats["misses"] == 3 and stats["hits"] == 2 + 1  # +1: the get() above


def test_a_cache_salt_keeps_one_scope_s_prefix_from_another_in_both_caching_methods(tiny_engine):
    """The same system prompt under two salts (two API keys) is computed twice: the second
    scope's ``cached_tokens`` is 0, as if the first had never sent it; within one scope it hits."""
    system = "You are a very careful assistant who always answers in full sentences. " * 8

    def run(method, salt, question="q"):
        return tiny_engine.generate(GenerationRequest(
            messages=[{"role": "user", "content": question}], prefix=system, method=method, cache_salt=salt, sampling=SamplingParams(max_new_tokens=4)))

    for method in ("prefix_cache", "paged"):
        assert run(method, f"{method}-key-a").usage.cached_tokens == 0
        assert run(method, f"{method}-key-b").usage.cached_tokens == 0
        again = run(method, f"{method}-key-a", "another question")
        assert again.usage.cached_tokens > 0, method
