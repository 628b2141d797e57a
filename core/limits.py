"""Per-client limits kept in Redis, shared by every web process.

Requests: a fixed one-minute window per client, one counter key per (client, minute),
incremented and given a TTL in one transaction, so gunicorn's processes share the count.

Open streams: one sorted set per client, a member per open stream scored with its lease
deadline. A web process renews the leases of its open streams while they run and removes itself when it closes; a web
process that dies without closing leaves members whose leases simply run out, so a crash
never locks a client out for longer than one lease.
"""
from __future__ import annotations

import math
import time

import redis

from core import keys

WINDOW_S = 60


def over_rate_limit(client: redis.Redis, rate_id: str, limit: int, now: float | None = None) -> int | None:
    """Count one request of ``rate_id``; the seconds until its window ends when this request is
    over ``limit`` per minute, else ``None``."""
    now = time.time() if now is None else now
    window = int(now // WINDOW_S)
    counter = keys.rate_key(rate_id, window)
    pipe = client.pipeline(transaction=True)
    pipe.incr(counter)
    pipe.expire(counter, 2 * WINDOW_S)
    count = pipe.execute()[0]
    if count <= limit:
        return None
    return max(1, math.ceil((window + 1) * WINDOW_S - now))


def open_stream(client: redis.Redis, clients: tuple[str, ...], token: str, limit: int, lease_s: float,
                now: float | None = None) -> str | None:
    """Count one more open stream for each of ``clients`` (an API key's id, an address); the
    first client already at ``limit`` is returned (and nothing is counted), else ``None``."""
    now = time.time() if now is None else now
    pipe = client.pipeline(transaction=True)
    for name in clients:
        pipe.zremrangebyscore(keys.streams_key(name), "-inf", now)
        pipe.zadd(keys.streams_key(name), {token: now + lease_s})
        pipe.zcard(keys.streams_key(name))
        pipe.expire(keys.streams_key(name), math.ceil(lease_s))
    counts = pipe.execute()[2::4]
    for name, count in zip(clients, counts):
        if count > limit:
            close_stream(client, clients, token)
            return name
    return None


def renew_streams(client: redis.Redis, streams: list[tuple[tuple[str, ...], str]], lease_s: float) -> None:
    """:func:`renew_stream` for many open streams (``(clients, token)`` each) in one pipeline:
    one ``ZADD XX`` and one ``EXPIRE`` per client, however many streams it holds."""
    deadline, tokens = time.time() + lease_s, {}
    for clients, token in streams:
        for name in clients:
            tokens.setdefault(name, {})[token] = deadline
    pipe = client.pipeline(transaction=False)
    for name, members in tokens.items():
        pipe.zadd(keys.streams_key(name), members, xx=True)
        pipe.expire(keys.streams_key(name), math.ceil(lease_s))
    pipe.execute()


def close_stream(client: redis.Redis, clients: tuple[str, ...], token: str) -> None:
    pipe = client.pipeline(transaction=False)
    for name in clients:
        pipe.zrem(keys.streams_key(name), token)
    pipe.execute()
