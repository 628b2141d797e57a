"""Worker presence: each worker process publishes a heartbeat with its self-description.

The monitor page, ``/healthz`` and ``/workers`` read it back. A worker that stops
heart-beating disappears after ``max_age_s``.
"""
from __future__ import annotations

import json
import time
from typing import Any

import redis

from core import keys


def publish_heartbeat(client: redis.Redis, name: str, info: dict[str, Any], ttl_s: int = 30) -> None:
    """Store ``info`` (model, device, dtype, load time, concurrency, current jobs, cache stats)."""
    now = time.time()
    payload = json.dumps({**info, "name": name, "last_seen": now}, ensure_ascii=False, default=str)
    pipe = client.pipeline(transaction=False)
    pipe.set(keys.worker_key(name), payload, ex=ttl_s)
    pipe.zadd(keys.WORKERS_INDEX, {name: now})
    pipe.execute()


def remove_worker(client: redis.Redis, name: str) -> None:
    client.delete(keys.worker_key(name))
    client.zrem(keys.WORKERS_INDEX, name)


def list_workers(client: redis.Redis, max_age_s: float = 30.0) -> list[dict[str, Any]]:
    """Workers seen within ``max_age_s``, newest first; stale index entries are pruned."""
    cutoff = time.time() - max_age_s
    client.zremrangebyscore(keys.WORKERS_INDEX, "-inf", cutoff)
    names = client.zrevrange(keys.WORKERS_INDEX, 0, -1)
    if not names:
        return []
    raws = client.mget([keys.worker_key(n) for n in names])
    return [json.loads(raw) for raw in raws if raw]
