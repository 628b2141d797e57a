"""Webhook deliveries in Redis: the outbox, each job's delivery record, try markers and the
dead-letter list. The HTTP side is the worker's (worker/webhook_tasks.py).

The life of one delivery:

1. The Lua step that ends a job with a ``webhook_url`` puts its id in the **outbox**
   (``webhooks:outbox``, scored by when the next try is due: now). No ending can miss it.
2. Someone **claims** the due entry (:meth:`WebhookStore.claim`, one Lua step, so exactly one
   claimer wins): the worker that just ended the job, the web that cancelled it, or any
   worker's reaper loop, which drains due entries each tick. A claim counts a *try* (1, 2,
   ...) and pushes the entry's due time ``claim_s`` ahead, then a ``miniserve.webhook`` task
   carrying (job, round, try) goes on the ``webhooks`` queue.
3. The task marks its try (``SET NX``: a task delivered twice by the broker POSTs once) and
   POSTs. A 2xx ends the delivery; a failure makes the entry due again after a backoff
   (doubling each time); after ``MINISERVE_WEBHOOK_MAX_TRIES`` it leaves the outbox for the
   **dead letters** (``webhooks:dead``), which ``POST /webhooks/dead/{id}/replay`` puts back
   (a new *round* of tries, so its try ids are new).

A claim whose task never reports (its worker died) simply falls due again: the next claim is
a new try. The message id the receiver sees (``webhook-id``) stays the same throughout, so it
de-duplicates by it.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import redis

from core import keys

PENDING, DELIVERING, RETRYING, DELIVERED, DEAD = "pending", "delivering", "retrying", "delivered", "dead"
Send = Callable[[str, int, int], None]  # (job id, round, try): send the delivery task

# KEYS: outbox, delivery, job, dead. ARGV: job_id, now, claim_until, ttl, max_tries.
# Returns {round, try} for the claimer, {0, 0} when the entry is not due (or gone), {-1, 0}
# when the tries are spent without an answer (dead-lettered here).
_CLAIM = """
local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[2]) then return {0, 0} end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('HSET', KEYS[2], 'job_id', ARGV[1], 'url', redis.call('HGET', KEYS[3], 'webhook_url') or '',
             'owner', redis.call('HGET', KEYS[3], 'owner') or '', 'round', 1, 'tries', 0, 'created_at', ARGV[2])
end
redis.call('EXPIRE', KEYS[2], ARGV[4])
if tonumber(redis.call('HGET', KEYS[2], 'tries')) >= tonumber(ARGV[5]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
  redis.call('HSET', KEYS[2], 'state', 'dead', 'dead_at', ARGV[2], 'updated_at', ARGV[2])
  return {-1, 0}
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
local try = redis.call('HINCRBY', KEYS[2], 'tries', 1)
redis.call('HSET', KEYS[2], 'state', 'delivering', 'updated_at', ARGV[2])
return {tonumber(redis.call('HGET', KEYS[2], 'round')), try}
"""

# KEYS: outbox, delivery, dead. ARGV: job_id, round, try, now, outcome ('ok' | 'retry' | 'dead'),
#   next due (retry), answer JSON (status / error). An answer for a try that is no longer the
# latest (its claim ran out and a newer try was claimed) only records what it saw.
_REPORT = """
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('HSET', KEYS[2], 'last_answer', ARGV[7], 'updated_at', ARGV[4])
local current = redis.call('HGET', KEYS[2], 'round') == ARGV[2] and redis.call('HGET', KEYS[2], 'tries') == ARGV[3]
if ARGV[5] == 'ok' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[2], 'state', 'delivered', 'delivered_at', ARGV[4])
  return 1
end
if not current or redis.call('HGET', KEYS[2], 'state') == 'delivered' then return 0 end
if ARGV[5] == 'dead' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
  redis.call('HSET', KEYS[2], 'state', 'dead', 'dead_at', ARGV[4])
  return 1
end
redis.call('ZADD', KEYS[1], ARGV[6], ARGV[1])
redis.call('HSET', KEYS[2], 'state', 'retrying', 'next_at', ARGV[6])
return 1
"""

# KEYS: outbox, delivery, dead. ARGV: job_id, now. A dead letter back into the outbox, due
# now, with a new round of tries. Returns the round, or 0 when it is not a dead letter.
_REPLAY = """
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) or redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[2], 'tries', 0, 'state', 'pending', 'updated_at', ARGV[2])
redis.call('HDEL', KEYS[2], 'dead_at')
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return redis.call('HINCRBY', KEYS[2], 'round', 1)
"""


class NotDead(KeyError):
    """No dead letter for this job (or not visible to this owner)."""


@dataclass(frozen=True)
class Claimed:
    job_id: str
    round: int
    try_no: int

    @property
    def try_id(self) -> str:
        return f"{self.round}.{self.try_no}"


def message_id(job_id: str) -> str:
    """The ``webhook-id`` of a job's notification: the same on every try and every replay."""
    return f"msg_{job_id}"


def backoff_s(try_no: int, base_s: float, max_s: float) -> float:
    """Wait after the ``try_no``-th failed try: base, 2 x base, 4 x base, ... up to ``max_s``."""
    return min(max_s, base_s * 2 ** (try_no - 1))


@dataclass
class WebhookStore:
    client: redis.Redis  # decode_responses=True
    ttl_s: int = 7 * 24 * 3600
    max_tries: int = 5
    claim_s: float = 120.0  # a claimed try not reported by then falls due again (a new try)
    _scripts: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name, text in (("claim", _CLAIM), ("report", _REPORT), ("replay", _REPLAY)):
            self._scripts[name] = self.client.register_script(text)

    # ---- claiming and sending ---------------------------------------------------------------
    def claim(self, job_id: str, now: float | None = None) -> Claimed | None:
        now = time.time() if now is None else now
        round_no, try_no = self._scripts["claim"](
            keys=[keys.WEBHOOK_OUTBOX, keys.webhook_key(job_id), keys.job_key(job_id), keys.WEBHOOKS_DEAD],
            args=[job_id, repr(now), repr(now + self.claim_s), self.ttl_s, self.max_tries])
        return Claimed(job_id, int(round_no), int(try_no)) if int(try_no) > 0 else None

    def due(self, now: float | None = None, limit: int = 100) -> list[str]:
        now = time.time() if now is None else now
        return list(self.client.zrangebyscore(keys.WEBHOOK_OUTBOX, "-inf", now, start=0, num=limit))

    def dispatch(self, send: Send, job_ids: list[str] | None = None) -> list[Claimed]:
        """Claim each due entry (``job_ids``: only these) and send its delivery task. A send
        that fails leaves the claim to run out: the entry falls due again."""
        sent = []
        for job_id in (self.due() if job_ids is None else job_ids):
            claimed = self.claim(job_id)
            if claimed is not None:
                send(claimed.job_id, claimed.round, claimed.try_no)
                sent.append(claimed)
        return sent

    def mark_try(self, claimed: Claimed) -> bool:
        """True exactly once per try id (SET NX): a re-delivered task message never POSTs twice."""
        return bool(self.client.set(keys.webhook_try_key(claimed.job_id, claimed.try_id), "1", nx=True,
                                    ex=self.ttl_s))

    # ---- outcomes ---------------------------------------------------------------------------
    def report(self, claimed: Claimed, ok: bool, answer: dict[str, Any], retry_at: float | None) -> str:
        """Record a try's answer; returns what follows: ``delivered``, ``retrying`` or ``dead``."""
        outcome = "ok" if ok else ("dead" if retry_at is None else "retry")
        self._scripts["report"](
            keys=[keys.WEBHOOK_OUTBOX, keys.webhook_key(claimed.job_id), keys.WEBHOOKS_DEAD],
            args=[claimed.job_id, claimed.round, claimed.try_no, repr(time.time()), outcome,
                  repr(retry_at or 0.0), json.dumps(answer)])
        return {"ok": DELIVERED, "dead": DEAD, "retry": RETRYING}[outcome]

    def delivery(self, job_id: str) -> dict[str, Any] | None:
        raw = self.client.hgetall(keys.webhook_key(job_id))
        if not raw:
            return None
        out: dict[str, Any] = {k: v for k, v in raw.items() if k not in ("owner", "last_answer")}
        for name in ("round", "tries"):
            out[name] = int(raw.get(name, 0))
        for name in ("created_at", "updated_at", "dead_at", "delivered_at", "next_at"):
            if name in raw:
                out[name] = float(raw[name])
        out["last_answer"] = json.loads(raw["last_answer"]) if raw.get("last_answer") else None
        out["owner"] = raw.get("owner", "")
        return out

    # ---- dead letters -----------------------------------------------------------------------
    def dead(self, owner: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Dead letters, newest first (``owner`` given: only that owner's); gone ones pruned."""
        out, gone = [], []
        for job_id in self.client.zrevrange(keys.WEBHOOKS_DEAD, 0, -1):
            entry = self.delivery(job_id)
            if entry is None:
                gone.append(job_id)
                continue
            if owner is not None and entry["owner"] != owner:
                continue
            out.append({k: v for k, v in entry.items() if k != "owner"})
            if len(out) >= limit:
                break
        if gone:
            self.client.zrem(keys.WEBHOOKS_DEAD, *gone)
        return out

    def replay(self, job_id: str, owner: str | None = None) -> int:
        """Put a dead letter back in the outbox (a new round of tries); returns the round."""
        entry = self.delivery(job_id)
        if entry is None or (owner is not None and entry["owner"] != owner):
            raise NotDead(job_id)
        round_no = int(self._scripts["replay"](
            keys=[keys.WEBHOOK_OUTBOX, keys.webhook_key(job_id), keys.WEBHOOKS_DEAD], args=[job_id, repr(time.time())]))
        if not round_no:
            raise NotDead(job_id)
        return round_no


def webhook_store(client: redis.Redis, settings: Any) -> WebhookStore:
    """The store as ``settings`` configure it: a claim outlives one try's time limit with room
    for the task's wait in the ``webhooks`` queue."""
    return WebhookStore(client, ttl_s=settings.job_ttl_s, max_tries=settings.webhook_max_tries,
                        claim_s=max(60.0, 4 * settings.webhook_timeout_s))


def task_sender(celery: Any) -> Callable[..., None]:
    """``send(job_id, round, try, countdown=None)`` on a Celery app or client (by task name)."""
    from core import tasks

    def send(job_id: str, round_no: int, try_no: int, countdown: float | None = None) -> None:
        celery.send_task(tasks.WEBHOOK, args=[job_id, round_no, try_no], queue=tasks.WEBHOOK_QUEUE,
                         countdown=countdown)
    return send


def secret_for(settings: Any, owner: str) -> str:
    """The secret that signs ``owner``'s webhooks: its key's own, else the shared one ('' = none)."""
    from core.owners import by_owner

    own = by_owner(settings.webhook_secrets).get(owner, "") if owner else ""
    return own or settings.webhook_secret


def default_url_for(settings: Any, owner: str) -> str | None:
    """The webhook ``owner``'s jobs get when their request names none (per key, optional)."""
    from core.owners import by_owner

    return by_owner(settings.webhook_urls).get(owner) if owner else None
