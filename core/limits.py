"""Per-client request limits kept in Redis, shared by every web process.

A fixed one-minute window per client: one counter key per (client, minute), incremented
and given a TTL in one transaction, so gunicorn's processes share the count.
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
