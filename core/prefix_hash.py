"""The hash of a KV-cache block's contents, shared by the engine's block manager and the web's router.

A full block of ``block_size`` token ids is hashed together with its parent block's hash,
so one hash stands for the whole prefix up to and including that block (vLLM's and
nano-vllm's scheme). The block manager keys cached blocks by it; the web computes the same
value for a prompt's leading blocks to route the job to the worker holding them. Both
import this one function, so they cannot drift apart.

The hash is blake2b over fixed-width little-endian integers (not Python's ``hash``): equal
on every host, process and Python version, which routing across machines needs.

A *salt* (the job's ``cache_salt``: by default its API key's owner id) changes the root every
chain starts from, so two salts never share a block or a routing key: one key's cached
prompt can neither serve another key nor show in its ``cached_tokens`` (vLLM's ``cache_salt``).
"""
from __future__ import annotations

import struct
from hashlib import blake2b
from typing import Sequence

ROOT_HASH = 0x5EED  # the "parent" of a sequence's first block


def chain_hash(prev_hash: int, tokens: tuple[int, ...]) -> int:
    """Hash of a full block given its parent's hash: a signed 64-bit int."""
    data = struct.pack(f"<q{len(tokens)}q", prev_hash, *tokens)
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little", signed=True)


def salted_root(salt: str) -> int:
    """The root a chain starts from for this salt (``ROOT_HASH`` for none: unsalted as before)."""
    if not salt:
        return ROOT_HASH
    return int.from_bytes(blake2b(salt.encode("utf-8"), digest_size=8, person=b"kv-salt").digest(),
                          "little", signed=True)


def block_hashes(token_ids: Sequence[int], block_size: int, max_blocks: int | None = None,
                 root: int = ROOT_HASH) -> list[int]:
    """Chained hashes of the full blocks at the start of ``token_ids`` (at most ``max_blocks``)."""
    count = len(token_ids) // block_size
    if max_blocks is not None:
        count = min(count, max_blocks)
    hashes, prev = [], root
    for index in range(count):
        prev = chain_hash(prev, tuple(token_ids[index * block_size:(index + 1) * block_size]))
        hashes.append(prev)
    return hashes


def cache_scope(owner: str, shared_across_keys: bool, request_salt: str = "") -> str:
    """The salt a job's prompt blocks are hashed with: its key's owner id unless the operator
    shares the cache across keys, joined with the request's own ``cache_salt`` if any."""
    parts = [part for part in ("" if shared_across_keys else owner, request_salt) if part]
    return "|".join(parts)
