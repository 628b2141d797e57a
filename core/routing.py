"""Cache-aware routing in Redis: who holds which prompt prefix, and where a job should go.

Workers record the prefix key of each routed job they start (:func:`note_prefix`): one
``HSET`` + ``EXPIRE`` on ``route:prefix:<key>`` per job, done by the job's thread, never
inside a forward step. The web asks :func:`choose` for a queue: the own queue of the
least-loaded holder that is alive (fresh heartbeat) and not overloaded (bounded waiting
queue and running count) among the workers of the job's model, else the model's queue
(the shared queue for the web's own model, core/models.py). Every decision is counted
(:data:`DECISIONS`) for ``/metrics`` and the monitor page.

A job is only *sent* to a worker's queue; its record keeps its model's queue, so the reaper
re-queues a lease-expired job there. Messages left in a dead worker's own queue are moved
back to its model's queue (its *home*, noted at start) by :func:`rescue_orphans` (every
worker's reaper runs it).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from core import keys

ALIVE_S = 15.0  # three missed heartbeats (worker/runtime.py beats every 5 s): not routed to
SHARED_QUEUE = "generation"
HIT, NO_KEY, UNKNOWN, BUSY, OFF = "routed", "no_prefix", "not_cached", "holder_busy", "disabled"
DECISIONS = (HIT, NO_KEY, UNKNOWN, BUSY, OFF)


@dataclass(frozen=True)
class Decision:
    queue: str
    reason: str  # one of DECISIONS
    worker: str = ""  # the holder chosen (HIT only)


@dataclass(frozen=True)
class Limits:
    ttl_s: float  # a holder's claim older than this is ignored
    max_waiting: int  # a holder with this many jobs waiting in its own queue is busy


def note_prefix(client: redis.Redis, prefix_key: str, worker: str, ttl_s: int, now: float | None = None) -> None:
    """Worker side: ``worker`` is about to prefill this prefix (and keeps it in its cache)."""
    now = time.time() if now is None else now
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.prefix_holders_key(prefix_key), worker, repr(now))
    pipe.expire(keys.prefix_holders_key(prefix_key), ttl_s)
    pipe.execute()


def register_queue(client: redis.Redis, queue: str, worker: str, home: str = SHARED_QUEUE) -> None:
    """Worker side, at start: ``worker`` consumes ``queue`` (so orphans can be found later) and
    serves the model whose queue is ``home`` (where its orphans go back)."""
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.ROUTING_QUEUES, queue, worker)
    pipe.hset(keys.ROUTING_HOMES, queue, home)
    pipe.execute()


def choose(client: redis.Redis, prefix_key: str | None, limits: Limits, now: float | None = None, *,
           model: str | None = None, home: str = SHARED_QUEUE) -> Decision:
    """Web side: where a job with this prefix key should be sent (two pipelined round trips).
    With ``model``, only workers serving that model are candidates; ``home`` is the model's
    queue, the answer when no holder fits."""
    if not prefix_key:
        return Decision(home, NO_KEY)
    now = time.time() if now is None else now
    claims = client.hgetall(keys.prefix_holders_key(prefix_key))
    holders = [name for name, ts in claims.items() if now - float(ts) <= limits.ttl_s]
    if not holders:
        return Decision(home, UNKNOWN)
    best = _least_loaded(client, holders, limits, now, model)
    if best is None:
        return Decision(home, BUSY)
    return Decision(best[1], HIT, best[0])


def _least_loaded(client: redis.Redis, holders: list[str], limits: Limits, now: float,
                  model: str | None = None) -> tuple[str, str] | None:
    pipe = client.pipeline(transaction=False)
    for name in holders:
        pipe.zscore(keys.WORKERS_INDEX, name)
        pipe.hmget(keys.worker_key(name), "queue", "concurrency", "current_jobs", "model_id")
    replies = pipe.execute()
    alive = []
    for name, seen, (queue, concurrency, current, served) in zip(holders, replies[::2], replies[1::2]):
        if seen is None or now - float(seen) > ALIVE_S or not queue:
            continue
        if model is not None and (json.loads(served) if served else None) != model:
            continue  # holds the prefix, but for another model
        alive.append((name, json.loads(queue), int(json.loads(concurrency or "1")), len(json.loads(current or "[]"))))
    if not alive:
        return None
    pipe = client.pipeline(transaction=False)
    for _, queue, _, _ in alive:
        pipe.llen(keys.queue_key(queue))
    best: tuple[int, str, str] | None = None
    for (name, queue, concurrency, running), waiting in zip(alive, pipe.execute()):
        if waiting >= limits.max_waiting or running + waiting >= concurrency + limits.max_waiting:
            continue
        if best is None or running + waiting < best[0]:
            best = (running + waiting, name, queue)
    return None if best is None else (best[1], best[2])


ROUTED_TO = "routed_to:"  # field prefix in ROUTING_COUNTS: jobs routed to one worker


def count(client: redis.Redis, decision: Decision) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(keys.ROUTING_COUNTS, decision.reason, 1)
    if decision.worker:
        pipe.hincrby(keys.ROUTING_COUNTS, ROUTED_TO + decision.worker, 1)
    pipe.execute()


def counts(client: redis.Redis) -> dict[str, int]:
    raw = client.hgetall(keys.ROUTING_COUNTS)
    return {reason: int(raw.get(reason, 0)) for reason in DECISIONS}


def routed_to(client: redis.Redis) -> dict[str, int]:
    """Jobs routed to each worker (by heartbeat name) since Redis was last emptied."""
    raw = client.hgetall(keys.ROUTING_COUNTS)
    return {field[len(ROUTED_TO):]: int(n) for field, n in raw.items() if field.startswith(ROUTED_TO)}


def waiting(client: redis.Redis, workers: list[dict[str, Any]]) -> dict[str, int]:
    """Messages waiting in each listed worker's own queue."""
    pipe = client.pipeline(transaction=False)
    names = []
    for worker in workers:
        queue = (worker.get("info") or {}).get("queue")
        if queue:
            names.append(worker["name"])
            pipe.llen(keys.queue_key(queue))
    return dict(zip(names, pipe.execute()))


def rescue_orphans(client: redis.Redis, now: float | None = None, limit: int = 1000) -> int:
    """Move messages waiting in the own queue of a worker that stopped beating to its model's
    queue (the shared queue for the web's own model), at its head (``LMOVE``: atomic, nothing
    lost, order kept); returns how many moved."""
    now = time.time() if now is None else now
    moved = 0
    homes = client.hgetall(keys.ROUTING_HOMES)
    for queue, worker in client.hgetall(keys.ROUTING_QUEUES).items():
        seen = client.zscore(keys.WORKERS_INDEX, worker)
        if seen is not None and now - float(seen) <= ALIVE_S:
            continue
        home = keys.queue_key(homes.get(queue) or SHARED_QUEUE)
        while moved < limit and client.lmove(keys.queue_key(queue), home, "LEFT", "RIGHT"):
            moved += 1
        if seen is None and not client.llen(keys.queue_key(queue)):
            client.hdel(keys.ROUTING_QUEUES, queue)  # gone for good (index entry pruned)
            client.hdel(keys.ROUTING_HOMES, queue)
    return moved


def describe(decision: Decision, prefix_key: str | None, prefix_tokens: int) -> dict[str, Any]:
    """What the job's stored request keeps about its routing (shown on the monitor page)."""
    return {"prefix_key": prefix_key, "prefix_tokens": prefix_tokens, "decision": decision.reason,
            "worker": decision.worker}
