"""Worker heartbeats in Redis: workers write them, the web reads them (``/healthz``, ``/workers``).

A worker describes itself in the hash ``keys.worker_key(name)`` (every value JSON-encoded,
so numbers and nested cache statistics survive) and scores its name in the
``keys.WORKERS_INDEX`` sorted set with the time of its last heartbeat; the id of the model
it serves (``model_id``) is stamped in ``keys.MODELS_SEEN``. The hash expires
on its own when heartbeats stop; readers also drop entries older than ``max_age_s``.
"""
from __future__ import annotations

import json
import time
from typing import Any

import redis

from core import keys


def write_heartbeat(client: redis.Redis, name: str, info: dict[str, Any], ttl_s: int = 60,
                    now: float | None = None) -> None:
    """Record that worker ``name`` is alive, with its self-description and cache stats."""
    now = time.time() if now is None else now
    mapping = {field: json.dumps(value, ensure_ascii=False) for field, value in info.items()}
    mapping["last_seen"] = json.dumps(now)
    pipe = client.pipeline(transaction=True)
    pipe.delete(keys.worker_key(name))
    pipe.hset(keys.worker_key(name), mapping=mapping)
    pipe.expire(keys.worker_key(name), ttl_s)
    pipe.zadd(keys.WORKERS_INDEX, {name: now})
    if info.get("model_id"):  # the cluster remembers which models it serves (core/models.py)
        pipe.hset(keys.MODELS_SEEN, info["model_id"], repr(now))
    pipe.execute()


def remove_worker(client: redis.Redis, name: str) -> None:
    """Forget a worker at once (graceful shutdown)."""
    pipe = client.pipeline(transaction=True)
    pipe.delete(keys.worker_key(name))
    pipe.zrem(keys.WORKERS_INDEX, name)
    pipe.execute()


def list_workers(client: redis.Redis, max_age_s: float, now: float | None = None) -> list[dict[str, Any]]:
    """Workers seen within ``max_age_s``, most recent first: ``{"name", "last_seen",
    "age_s", "info": {...}}``. Stale index entries are pruned on the way."""
    now = time.time() if now is None else now
    client.zremrangebyscore(keys.WORKERS_INDEX, "-inf", f"({now - max_age_s}")
    names = client.zrevrange(keys.WORKERS_INDEX, 0, -1, withscores=True)
    pipe = client.pipeline(transaction=False)
    for name, _ in names:
        pipe.hgetall(keys.worker_key(name))
    workers = []
    for (name, seen), raw in zip(names, pipe.execute()):
        info = {field: _decode(value) for field, value in (raw or {}).items()}
        info.pop("last_seen", None)
        workers.append({"name": name, "last_seen": seen, "age_s": round(max(0.0, now - seen), 3), "info": info})
    return workers


def _decode(value: str) -> Any:
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def jobs_of_dead_workers(client: redis.Redis, dead_after_s: float, now: float | None = None) -> list[str]:
    """Running jobs (those holding a lease) whose worker has not beaten for ``dead_after_s``
    (or has left the index), among attempts started at least that long ago: the worker died
    with them. A lease only expires a whole lease after its last renewal; heartbeats tell
    within a few beats (worker/reaper.py)."""
    now = time.time() if now is None else now
    job_ids = client.zrange(keys.LEASES, 0, -1)
    if not job_ids:
        return []
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(keys.job_key(job_id), "worker", "started_at")
    rows = pipe.execute()
    names = sorted({worker for worker, _ in rows if worker})
    beats = dict(zip(names, client.zmscore(keys.WORKERS_INDEX, names))) if names else {}
    dead = []
    for job_id, (worker, started_at) in zip(job_ids, rows):
        if not worker or not started_at or now - float(started_at) < dead_after_s:
            continue
        beat = beats.get(worker)
        if beat is None or now - float(beat) > dead_after_s:
            dead.append(job_id)
    return dead
