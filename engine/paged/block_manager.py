"""Who owns which KV block: free list, per-sequence block tables, prefix sharing.

Pure bookkeeping (no tensors), so it is cheap to test and to reason about:

* A block is *free* (never hashed, on the free list), *used* (reference count > 0) or
  *cached* (reference count 0 but its full contents are known by hash; kept in an LRU and
  reused by a later sequence with the same prefix, or evicted when the pool needs room).
* Only full blocks whose K/V has been written (:meth:`BlockManager.commit`) get a hash.  The
  hash is chained with the previous block's hash, so a block stands for the whole prefix
  before it; a hit is verified against the block's token ids and parent hash, so a hash
  collision can never hand a sequence somebody else's K/V.
* Shared blocks are always full, and a sequence only ever writes into its last, private,
  partially filled block: nobody writes into a shared block.
* Allocation checks capacity first and raises :class:`KVPoolExhausted` before changing
  anything, so an exhausted pool never disturbs other sequences.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from core.prefix_hash import ROOT_HASH, chain_hash
from engine.paged.pool import KVPoolExhausted

HashFn = Callable[[int, tuple[int, ...]], int]
NO_HASH = None
# One character per block in :meth:`BlockManager.block_map` (the playground's pool view).
MAP_FREE, MAP_USED, MAP_SHARED, MAP_CACHED = ".", "u", "s", "c"


__all__ = ["BlockManager", "BlockStats", "ROOT_HASH", "chain_hash"]  # chain_hash: core.prefix_hash


@dataclass
class _Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = NO_HASH
    prev_hash: int | None = None
    token_ids: tuple[int, ...] = ()


@dataclass
class _Seq:
    block_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    num_committed: int = 0     # tokens whose K/V is written in the pool
    hashes: list[int] = field(default_factory=list)  # chained hashes of committed full blocks
    root: int = ROOT_HASH      # the salted start of its chain (core.prefix_hash.salted_root)


@dataclass
class BlockStats:
    """A snapshot for logs, the monitor and benchmarks."""

    num_blocks: int
    block_size: int
    blocks_used: int
    blocks_free: int
    blocks_cached: int
    peak_blocks_used: int
    sequences: int
    logical_tokens: int      # sum of sequence lengths (shared prefix counted per sequence)
    tokens_stored: int       # token slots physically written in used blocks
    empty_slots: int         # allocated to a sequence but not (yet) filled
    prefix_queries: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    prefix_hit_blocks: int
    evictions: int

    @property
    def fragmentation(self) -> float:
        """Internal fragmentation: empty share of the slots held by used blocks."""
        slots = self.blocks_used * self.block_size
        return self.empty_slots / slots if slots else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    def to_dict(self) -> dict:
        data = dict(self.__dict__)
        data["fragmentation"] = round(self.fragmentation, 6)
        data["prefix_hit_rate"] = round(self.prefix_hit_rate, 6)
        return data


class BlockManager:
    """Block tables for sequences over a pool of ``num_blocks`` blocks of ``block_size``."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_sharing: bool = True,
                 hash_fn: HashFn = chain_hash):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_sharing = prefix_sharing
        self._hash_fn = hash_fn
        self._blocks = [_Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()  # LRU: first = evicted first
        self._by_hash: dict[int, int] = {}
        self._seqs: dict[Hashable, _Seq] = {}
        self._used = 0
        self._peak = 0
        self._queries = self._query_tokens = self._hit_tokens = self._hit_blocks = 0
        self._evictions = 0

    # ----------------------------------------------------------------- queries
    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    def block_table(self, seq_id: Hashable) -> list[int]:
        return list(self._seqs[seq_id].block_ids)

    def num_tokens(self, seq_id: Hashable) -> int:
        return len(self._seqs[seq_id].token_ids)

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    @property
    def num_available(self) -> int:
        """Blocks a new allocation could take: free plus evictable cached ones."""
        return len(self._free) + len(self._cached)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def slots(self, seq_id: Hashable, start: int, end: int) -> list[int]:
        """Physical slot numbers of token positions ``start..end-1`` of a sequence."""
        table, bs = self._seqs[seq_id].block_ids, self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def append_cost(self, seq_id: Hashable, num_new: int = 1) -> int:
        """New blocks that appending ``num_new`` tokens would take."""
        seq = self._seqs[seq_id]
        return self.blocks_needed(len(seq.token_ids) + num_new) - len(seq.block_ids)

    # ----------------------------------------------------------------- prefix lookup
    def _match_prefix(self, token_ids: Sequence[int], root: int = ROOT_HASH) -> list[tuple[int, int]]:
        """Cached blocks for the longest block-aligned prefix, leaving at least one token to
        compute (the forward needs it for logits). Returns ``(block_id, hash)`` pairs. ``root``:
        the chain's salted start (``core.prefix_hash.salted_root``): other salts never match."""
        if not self.prefix_sharing:
            return []
        bs, found, prev = self.block_size, [], root
        for index in range((len(token_ids) - 1) // bs):
            tokens = tuple(token_ids[index * bs:(index + 1) * bs])
            h = self._hash_fn(prev, tokens)
            block_id = self._by_hash.get(h)
            if block_id is None:
                break
            block = self._blocks[block_id]
            if block.token_ids != tokens or block.prev_hash != prev:
                break  # hash collision: the token check keeps the wrong K/V out
            found.append((block_id, h))
            prev = h
        return found

    def cached_prefix_tokens(self, token_ids: Sequence[int], root: int = ROOT_HASH) -> int:
        """How many leading tokens :meth:`allocate` would find cached (no side effects)."""
        return len(self._match_prefix(token_ids, root)) * self.block_size

    def can_allocate(self, token_ids: Sequence[int], reserve: int = 0, root: int = ROOT_HASH) -> bool:
        """Whether :meth:`allocate` would succeed with ``reserve`` blocks left over."""
        hits = self._match_prefix(token_ids, root)
        return self._new_blocks_ok(len(token_ids), hits, reserve)

    def _new_blocks_ok(self, n_tokens: int, hits: list[tuple[int, int]], reserve: int) -> bool:
        revived = sum(1 for block_id, _ in hits if block_id in self._cached)
        fresh = self.blocks_needed(n_tokens) - len(hits)
        return fresh + reserve <= self.num_available - revived

    # ----------------------------------------------------------------- mutation
    def allocate(self, seq_id: Hashable, token_ids: Sequence[int], root: int = ROOT_HASH) -> int:
        """Give a new sequence blocks for all of ``token_ids``; returns the number of leading
        tokens whose K/V is already in the pool (prefix hit, block-aligned, same ``root``)."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        if not token_ids:
            raise ValueError("a sequence needs at least one token")
        hits = self._match_prefix(token_ids, root)
        if not self._new_blocks_ok(len(token_ids), hits, 0):
            raise KVPoolExhausted(
                f"need {self.blocks_needed(len(token_ids)) - len(hits)} blocks, "
                f"{self.num_available} available of {self.num_blocks}")
        seq = _Seq(token_ids=list(token_ids), root=root)
        for block_id, h in hits:
            self._take(block_id)
            seq.block_ids.append(block_id)
            seq.hashes.append(h)
        for _ in range(self.blocks_needed(len(token_ids)) - len(hits)):
            seq.block_ids.append(self._take_fresh())
        seq.num_committed = len(hits) * self.block_size
        self._seqs[seq_id] = seq
        self._queries += 1
        self._query_tokens += len(token_ids)
        self._hit_blocks += len(hits)
        self._hit_tokens += seq.num_committed
        return seq.num_committed

    def append(self, seq_id: Hashable, token_ids: Sequence[int]) -> list[int]:
        """Extend a sequence by ``token_ids`` (usually one decoded token), taking a new block
        only when the last one is full. Returns the slots to write their K/V into."""
        seq = self._seqs[seq_id]
        extra = self.append_cost(seq_id, len(token_ids))
        if extra > self.num_available:
            raise KVPoolExhausted(f"need {extra} blocks, {self.num_available} available")
        for _ in range(extra):
            seq.block_ids.append(self._take_fresh())
        start = len(seq.token_ids)
        seq.token_ids.extend(token_ids)
        return self.slots(seq_id, start, len(seq.token_ids))

    def commit(self, seq_id: Hashable, num_tokens: int | None = None) -> None:
        """Record that K/V for the first ``num_tokens`` (default: all) tokens is written, and
        publish the hashes of blocks that became full so later sequences can share them."""
        seq = self._seqs[seq_id]
        upto = len(seq.token_ids) if num_tokens is None else num_tokens
        seq.num_committed = max(seq.num_committed, upto)
        bs = self.block_size
        while len(seq.hashes) < seq.num_committed // bs:
            index = len(seq.hashes)
            tokens = tuple(seq.token_ids[index * bs:(index + 1) * bs])
            prev = seq.hashes[-1] if seq.hashes else seq.root
            h = self._hash_fn(prev, tokens)
            seq.hashes.append(h)
            block = self._blocks[seq.block_ids[index]]
            if self.prefix_sharing and block.hash is None and h not in self._by_hash:
                block.hash, block.prev_hash, block.token_ids = h, prev, tokens
                self._by_hash[h] = block.block_id

    def truncate(self, seq_id: Hashable, num_tokens: int) -> None:
        """Cut a sequence back to its first ``num_tokens`` tokens (speculative decoding's
        rejected drafts). Only tokens not yet committed can go, so no hashed or shared block
        is ever touched: the blocks no longer needed are private and unhashed, and go to the
        front of the free list (the next append takes the same block again); the slots
        left in the kept last block are simply overwritten by the next tokens."""
        seq = self._seqs[seq_id]
        if not seq.num_committed <= num_tokens <= len(seq.token_ids):
            raise ValueError(f"cannot truncate sequence {seq_id!r} to {num_tokens} tokens: "
                             f"{seq.num_committed} committed, {len(seq.token_ids)} held")
        del seq.token_ids[num_tokens:]
        keep = self.blocks_needed(num_tokens)
        while len(seq.block_ids) > keep:
            block = self._blocks[seq.block_ids.pop()]
            if block.ref_count != 1 or block.hash is not None:
                raise AssertionError(f"block {block.block_id} past the committed tokens is shared")
            block.ref_count = 0
            self._used -= 1
            self._free.appendleft(block.block_id)

    def free(self, seq_id: Hashable) -> None:
        """Drop a sequence: unshared unhashed blocks go back to the free list, hashed ones to
        the LRU cache (tail blocks first, so they are evicted before the shared head)."""
        seq = self._seqs.pop(seq_id)
        for block_id in reversed(seq.block_ids):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._used -= 1
                if block.hash is None:
                    self._free.append(block_id)
                else:
                    self._cached[block_id] = None

    # ----------------------------------------------------------------- internals
    def _take(self, block_id: int) -> None:
        block = self._blocks[block_id]
        if block.ref_count == 0:
            self._cached.pop(block_id, None)
            self._used += 1
            self._peak = max(self._peak, self._used)
        block.ref_count += 1

    def _evict(self) -> int:
        block_id, _ = self._cached.popitem(last=False)
        block = self._blocks[block_id]
        del self._by_hash[block.hash]
        block.hash, block.prev_hash, block.token_ids = None, None, ()
        self._evictions += 1
        self._free.append(block_id)
        return block_id

    def _take_fresh(self) -> int:
        if not self._free:
            self._evict()
        block_id = self._free.popleft()
        self._take(block_id)
        return block_id

    # ----------------------------------------------------------------- stats
    def block_map(self) -> str:
        """Every block's state, one character each (free, used by one sequence, shared by
        several, cached): a 1,024-block pool is a 1 KB string, small enough for a heartbeat.
        Built from the cached set and the block tables, so its cost follows the blocks held."""
        cells = bytearray(MAP_FREE * self.num_blocks, "ascii")
        for block_id in self._cached:
            cells[block_id] = ord(MAP_CACHED)
        for seq in self._seqs.values():
            for block_id in seq.block_ids:
                cells[block_id] = ord(MAP_SHARED if self._blocks[block_id].ref_count > 1 else MAP_USED)
        return cells.decode("ascii")

    def stats(self) -> BlockStats:
        logical = sum(len(s.token_ids) for s in self._seqs.values())
        empty = sum(len(s.block_ids) * self.block_size - len(s.token_ids)
                    for s in self._seqs.values())
        return BlockStats(
            num_blocks=self.num_blocks, block_size=self.block_size, blocks_used=self._used,
            blocks_free=len(self._free), blocks_cached=len(self._cached),
            peak_blocks_used=self._peak, sequences=len(self._seqs), logical_tokens=logical,
            tokens_stored=self._used * self.block_size - empty, empty_slots=empty,
            prefix_queries=self._queries, prefix_query_tokens=self._query_tokens,
            prefix_hit_tokens=self._hit_tokens, prefix_hit_blocks=self._hit_blocks,
            evictions=self._evictions)
