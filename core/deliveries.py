"""Task messages that never turn into a started job, found and re-sent by the sweeper.

After the sender confirms a job's message went out, the job waits in ``jobs:pending`` until
an attempt starts. Two faults can strand it there, both seen in the soak:

* the worker that took the message died before starting it: with late acks the message
  sits in kombu's ``unacked`` set until the broker's visibility timeout (hard time limit +
  5 minutes) gives it back;
* the worker died between kombu's ``BRPOP`` and its write to ``unacked`` (two steps): the
  message is gone.

Our workers start every message they take at once (prefetch one per slot), so a pending
job older than ``older_than_s`` whose current message (its dispatch number) is still in its
queue is waiting its turn; one whose message was delivered more than ``older_than_s`` ago,
or is nowhere, is stranded: it is re-sent with a new dispatch number, and the old message,
should it come back, is stale and skipped. A wrong guess (a message moving from the queue
to ``unacked`` between the two reads) only costs the job its place in the queue, never a
second run.
"""
from __future__ import annotations

import base64
import json
import time
from typing import Any

from core import keys
from core.events import QUEUED
from core.jobs import JobNotFound, JobStore
from core.models import model_queues

MAX_QUEUE_SCAN = 10_000  # longer queues are not scanned (their pending jobs are left to wait)


def stranded_jobs(store: JobStore, older_than_s: float, now: float | None = None, limit: int = 200) -> list[str]:
    """Pending jobs whose current message is stuck in ``unacked`` or lost."""
    now = time.time() if now is None else now
    candidates = store.client.zrangebyscore(keys.PENDING, "-inf", now - older_than_s, start=0, num=limit)
    if not candidates:
        return []
    waiting = _queued_jobs(store, candidates)
    if waiting is None:
        return []
    delivered = _unacked(store)
    stranded = []
    for job_id in candidates:
        try:
            record = store.get(job_id)
        except JobNotFound:
            record = None
        if record is None or record.state != QUEUED:
            store.client.zrem(keys.PENDING, job_id)
            continue
        current = (job_id, record.dispatch)
        if current in waiting:
            continue
        if current in delivered and delivered[current] > now - older_than_s:
            continue
        stranded.append(job_id)
    return stranded


def _queued_jobs(store: JobStore, candidates: list[str]) -> set[tuple[str, int]] | None:
    """(job id, dispatch) of every message waiting in a queue; ``None`` when a queue is too
    long to scan."""
    found: set[tuple[str, int]] = set()
    routed = store.client.hkeys(keys.ROUTING_QUEUES)  # workers' own queues (cache-aware routing)
    for queue in (*keys.QUEUES, *model_queues(store.client), *routed):
        if store.client.llen(keys.queue_key(queue)) > MAX_QUEUE_SCAN:
            return None
        for raw in store.client.lrange(keys.queue_key(queue), 0, -1):
            target = job_message(raw)
            if target is not None:
                found.add(target)
    return found


def _unacked(store: JobStore) -> dict[tuple[str, int], float]:
    """(job id, dispatch) -> delivery time of every delivered, unacknowledged job message."""
    entries = store.client.hgetall(keys.KOMBU_UNACKED)
    times = dict(zip(entries, store.client.zmscore(keys.KOMBU_UNACKED_INDEX, list(entries)))) if entries else {}
    out = {}
    for tag, raw in entries.items():
        try:
            message = json.loads(raw)[0]
        except (ValueError, IndexError, TypeError):
            continue
        target = job_message(message)
        if target is not None:
            out[target] = float(times.get(tag) or 0.0)
    return out


def job_message(raw: str | dict[str, Any]) -> tuple[str, int] | None:
    """(job id, dispatch number) of a Celery task message (kombu's JSON envelope), or
    ``None`` for anything else (e.g. an evaluation chord's task)."""
    try:
        message = json.loads(raw) if isinstance(raw, str) else raw
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        job_id = message["headers"]["id"]
        if not args or args[0] != job_id:
            return None
        return job_id, int(args[1]) if len(args) > 1 else 0
    except (ValueError, KeyError, TypeError, IndexError):
        return None
