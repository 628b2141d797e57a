"""An LRU of computed prefix KV, keyed by the prefix's exact token ids.

Bounded twice: at most ``max_entries`` prefixes and at most ``max_tokens`` cached tokens in
total (``MINISERVE_PREFIX_CACHE_MAX_ENTRIES`` / ``..._MAX_TOKENS``); the least recently used
entries go first. A prefix longer than the token budget is not stored at all.

Entries are never mutated: a request that hits copies the stored keys/values into its own
cache (:meth:`ContiguousKVCache.load`), so decoding writes only to its own buffer.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class PrefixEntry:
    keys: torch.Tensor  # [layers, kv_heads, tokens, head_dim]
    values: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.keys.shape[2])

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


class PrefixCache:
    def __init__(self, max_entries: int, max_tokens: int) -> None:
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()
        self._tokens = 0
        self.hits = self.misses = self.evictions = self.rejected = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Sequence[int]) -> bool:
        return tuple(key) in self._entries

    def keys(self) -> list[tuple[int, ...]]:
        """Keys from least to most recently used."""
        return list(self._entries)

    def get(self, key: Sequence[int]) -> PrefixEntry | None:
        """The entry for exactly these ids (a hit refreshes its recency), else None (a miss)."""
        entry = self._entries.get(tuple(key))
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(tuple(key))
        self.hits += 1
        return entry

    def put(self, key: Sequence[int], keys: torch.Tensor, values: torch.Tensor) -> bool:
        """Store a prefix's KV (the caller hands over tensors nobody else writes). False if too big."""
        key = tuple(key)
        entry = PrefixEntry(keys, values)
        if entry.tokens > self.max_tokens:
            self.rejected += 1
            return False
        if key in self._entries:
            self._drop(key)
        while self._entries and (len(self._entries) >= self.max_entries
                                 or self._tokens + entry.tokens > self.max_tokens):
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        self._entries[key] = entry
        self._tokens += entry.tokens
        return True

    def _drop(self, key: tuple[int, ...]) -> None:
        self._tokens -= self._entries.pop(key).tokens

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "rejected": self.rejected, "entries": len(self._entries),
                "cached_tokens": self._tokens,
                "bytes": sum(e.nbytes for e in self._entries.values()),
                "max_entries": self.max_entries, "max_tokens": self.max_tokens}
