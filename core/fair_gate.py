"""The fair gate: the order in which waiting jobs reach their queue's Celery list.

A Celery queue on Redis is a FIFO list, and a worker takes its oldest message. Sent
straight there, a batch of 10,000 jobs from one key would sit in front of every later
chat. So only a few messages wait in a queue at once (``MINISERVE_QUEUE_WINDOW``, counted
by the queue's line: messages sent and not yet started, core/jobs.py). A job that finds
the window full is *held* in Redis instead, in one list per (queue, priority class, owner),
and *released* (its message sent) as the line drains:

1. by class: every held ``interactive`` job goes before any ``default`` one, and those
   before any ``batch`` one (core/priorities.py);
2. within a class, by turns between owners (API keys): one job from each owner with held
   jobs, round and round, so a key that floods the queue delays its own jobs, not other
   keys' (round-robin over per-key lists, counted in jobs).

Both steps are Lua scripts, so concurrent webs and workers can admit and release at once.
A release is asked for after a hold (the line may have drained meanwhile), after every
start (the line just got shorter: worker/job_runner.py) and on every reaper tick (a safety
net for a worker that died between the two). A released job is *undispatched* until its
message is confirmed sent, so a releaser that dies before sending leaves it to the
sweeper (worker/reaper.py), like any unsent job. Jobs routed to one worker's own queue
(cache-aware routing) do not pass the gate: that queue's own limit bounds it.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from core import keys, tasks
from core.logs import log_event
from core.model_source import EMBEDDING
from core.priorities import BATCH, PRIORITY_CLASSES

# How many jobs of class ``cls`` run or wait in the line ``line``: its running set (filled when
# its jobs start: leave_line in core/scripts.py) is pruned of jobs no longer running first.
_TAKEN = """
local function class_taken(line, job_prefix, cls)
  local running = line .. ':running:' .. cls
  for _, id in ipairs(redis.call('ZRANGE', running, 0, -1)) do
    if redis.call('HGET', job_prefix .. id, 'state') ~= 'running' then redis.call('ZREM', running, id) end
  end
  local taken = redis.call('ZCARD', running)
  for _, id in ipairs(redis.call('ZRANGE', line, 0, -1)) do
    if redis.call('HGET', job_prefix .. id, 'priority') == cls then taken = taken + 1 end
  end
  return taken
end
"""

logger = logging.getLogger("miniserve.fair_gate")

# KEYS: job, line, line_starts, seq, held_queues, held_counts, owners, held, undispatched,
# queued_by_owner. ARGV: job_id, window, queue, owner, class, the class's cap (-1: none), job
# key prefix. Returns 1: send now (the job joined the line), 0: held, -1: no longer queued.
ADMIT = _TAKEN + """
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' then return -1 end
redis.call('HSET', KEYS[1], 'queued_owner', ARGV[4], 'priority', ARGV[5])
redis.call('HINCRBY', KEYS[10], ARGV[4], 1)
local cap = tonumber(ARGV[6])
if redis.call('SISMEMBER', KEYS[5], ARGV[3]) == 0 and redis.call('ZCARD', KEYS[2]) < tonumber(ARGV[2])
    and (cap < 0 or class_taken(KEYS[2], ARGV[7], ARGV[5]) < cap) then
  local n = redis.call('INCR', KEYS[4])
  redis.call('ZADD', KEYS[2], n, ARGV[1])
  redis.call('HSET', KEYS[1], 'line', KEYS[2], 'line_starts', KEYS[3])
  return 1
end
redis.call('ZREM', KEYS[9], ARGV[1])  -- not 'undispatched' while held: the sweeper must not send it
redis.call('RPUSH', KEYS[8], ARGV[1])
if redis.call('LLEN', KEYS[8]) == 1 then redis.call('RPUSH', KEYS[7], ARGV[4]) end
redis.call('SADD', KEYS[5], ARGV[3])
redis.call('HINCRBY', KEYS[6], ARGV[3], 1)
redis.call('HSET', KEYS[1], 'held', KEYS[8])
return 0
"""

# KEYS: line, line_starts, seq, held_queues, held_counts, undispatched, then one owners list
# per class, most urgent first. ARGV: queue, window, held prefix, job key prefix, now, then
# per class (in KEYS' order) its name and its cap (the most of its jobs running or in the
# line at once; -1: none). Returns the released job ids, in release order.
RELEASE = _TAKEN + """
local released = {}
local room = tonumber(ARGV[2]) - redis.call('ZCARD', KEYS[1])
local left = 0
for c = 1, #KEYS - 6 do
  local owners = KEYS[6 + c]
  local cls, cap = ARGV[4 + 2 * c], tonumber(ARGV[5 + 2 * c])
  local budget = room
  if cap >= 0 then budget = math.min(room, cap - class_taken(KEYS[1], ARGV[4], cls)) end
  while room > 0 and budget > 0 do
    local owner = redis.call('LMOVE', owners, owners, 'LEFT', 'RIGHT')
    if not owner then break end
    local held = ARGV[3] .. cls .. ':owner:' .. owner
    local id = redis.call('LPOP', held)
    if redis.call('LLEN', held) == 0 then redis.call('LREM', owners, -1, owner) end
    if id then
      redis.call('HINCRBY', KEYS[5], ARGV[1], -1)
      local job = ARGV[4] .. id
      redis.call('HDEL', job, 'held')
      if redis.call('HGET', job, 'state') == 'queued' then
        local n = redis.call('INCR', KEYS[3])
        redis.call('ZADD', KEYS[1], n, id)
        redis.call('HSET', job, 'line', KEYS[1], 'line_starts', KEYS[2])
        redis.call('ZADD', KEYS[6], ARGV[5], id)
        table.insert(released, id)
        room = room - 1
        budget = budget - 1
      end
    end
  end
  left = left + redis.call('LLEN', owners)
end
if left == 0 then
  redis.call('SREM', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[5], ARGV[1])
end
return released
"""


class TaskSender(Protocol):
    def send_task(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any: ...


@dataclass(frozen=True)
class HeldPlace:
    """A held job's place: jobs ahead of it in its queue (the line, then the held jobs the
    gate releases before it), counting held jobs that were cancelled but not yet passed."""

    ahead: int
    queue: str


class FairGate:
    """Admit and release jobs for one Redis; ``window`` 0 admits everything at once."""

    @classmethod
    def from_settings(cls, client: redis.Redis, settings: Any) -> "FairGate":
        return cls(client, settings.queue_window, settings.reserved_slots)

    def __init__(self, client: redis.Redis, window: int, reserved_slots: int = 0) -> None:
        self.client = client
        self.window = window
        self.reserved_slots = reserved_slots
        self._admit = client.register_script(ADMIT)
        self._release = client.register_script(RELEASE)

    def admit(self, job_id: str, queue: str, priority: str, owner: str, slots: int | None = None) -> int:
        """1: send the job's message now (it joined the line); 0: held; -1: not queued any more.
        ``slots``: as for :meth:`release`."""
        window = self.window if self.window > 0 else 2**31
        cap = self.batch_cap(queue if slots is None else slots) if priority == BATCH else -1
        return int(self._admit(
            keys=[keys.job_key(job_id), keys.line_key(queue), keys.line_starts_key(queue), keys.LINE_SEQ,
                  keys.HELD_QUEUES, keys.HELD_COUNTS, keys.held_owners_key(queue, priority),
                  keys.held_key(queue, priority, owner), keys.UNDISPATCHED, keys.QUEUED_BY_OWNER],
            args=[job_id, window, queue, owner, priority, cap, keys.JOB_KEY_PREFIX]))

    def release(self, queue: str, now: float | None = None, slots: int | None = None) -> list[str]:
        """Held jobs of ``queue`` whose turn came, as many as the window has room for: each
        joined the line and counts as undispatched until its message is confirmed sent.
        ``slots``: the worker slots that take the queue's messages (None: the live workers'
        heartbeats say); ``batch`` jobs leave ``reserved_slots`` of them to the other classes."""
        if not self.client.sismember(keys.HELD_QUEUES, queue):
            return []  # nothing held here: no heartbeat read, no script
        window = self.window if self.window > 0 else 2**31
        caps = {BATCH: self.batch_cap(queue if slots is None else slots)}
        per_class = [item for c in PRIORITY_CLASSES for item in (c, caps.get(c, -1))]
        return list(self._release(
            keys=[keys.line_key(queue), keys.line_starts_key(queue), keys.LINE_SEQ, keys.HELD_QUEUES,
                  keys.HELD_COUNTS, keys.UNDISPATCHED,
                  *(keys.held_owners_key(queue, c) for c in PRIORITY_CLASSES)],
            args=[queue, window, keys.held_prefix(queue), keys.JOB_KEY_PREFIX,
                  repr(time.time() if now is None else now), *per_class]))

    def batch_cap(self, queue_or_slots: str | int) -> int:
        """The most ``batch`` jobs of a queue running or waiting in its line at once: its
        slots less the reserved ones, at least one; -1 (no cap) without a reserve or slots."""
        if self.reserved_slots <= 0 or self.window <= 0:  # no reserve, or no gate at all
            return -1
        slots = queue_or_slots if isinstance(queue_or_slots, int) else queue_slots(self.client, queue_or_slots)
        return max(1, slots - self.reserved_slots) if slots > 0 else -1

    def held_queues(self) -> list[str]:
        return sorted(self.client.smembers(keys.HELD_QUEUES))

    def held_counts(self) -> dict[str, int]:
        return {queue: int(n) for queue, n in self.client.hgetall(keys.HELD_COUNTS).items()}

    def held_by_class(self) -> dict[str, dict[str, dict[str, int]]]:
        """queue -> class -> owner -> held jobs (the monitor's view of who waits at the gate)."""
        view: dict[str, dict[str, dict[str, int]]] = {}
        for queue in self.held_queues():
            for cls in PRIORITY_CLASSES:
                owners = self.client.lrange(keys.held_owners_key(queue, cls), 0, -1)
                counts = {o: int(self.client.llen(keys.held_key(queue, cls, o))) for o in owners}
                if counts:
                    view.setdefault(queue, {})[cls] = counts
        return view

    def queued_by(self, owner: str) -> int:
        """The owner's jobs admitted and not yet started or ended (held or waiting in a line)."""
        return int(self.client.hget(keys.QUEUED_BY_OWNER, owner) or 0)

    def held_place(self, job_id: str) -> HeldPlace | None:
        """Where a held job stands, or None when it is not held. Everything in the line goes
        first; then every held job of a more urgent class; then, in its own class, each other
        owner's jobs up to the turn its own job is due in."""
        held = self.client.hget(keys.job_key(job_id), "held")
        if not held:
            return None
        queue, priority, owner = keys.held_key_parts(held)
        index = self.client.lpos(held, job_id)
        if index is None:
            return None
        ahead = int(self.client.zcard(keys.line_key(queue))) + index
        for cls in PRIORITY_CLASSES:
            owners = self.client.lrange(keys.held_owners_key(queue, cls), 0, -1)
            lengths = [int(self.client.llen(keys.held_key(queue, cls, o))) for o in owners]
            if cls != priority:
                ahead += sum(lengths)
                continue
            turn = owners.index(owner) if owner in owners else len(owners)
            ahead += sum(min(n, index + (1 if i < turn else 0)) for i, (o, n) in enumerate(zip(owners, lengths))
                         if o != owner)
            break
        return HeldPlace(ahead, queue)


def queue_slots(client: redis.Redis, queue: str, alive_s: float = 15.0) -> int:
    """Worker slots that take ``queue``'s messages, from heartbeats younger than ``alive_s``
    (read only: the web's listing prunes the index): a model's queue (``generation.<model
    id>``) is its model's workers'; a shared one every chat worker's."""
    _, dot, model = queue.partition(".")
    names = client.zrangebyscore(keys.WORKERS_INDEX, time.time() - alive_s, "+inf")
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hmget(keys.worker_key(name), "concurrency", "model_id", "model_kind", "pool")
    total = 0
    for concurrency, model_id, kind, pool in pipe.execute():
        served, kind = _json(model_id), _json(kind)
        if (served == model) if dot else (kind != EMBEDDING):
            # A prefork child beats on its own (one slot each); a threads worker has them all.
            total += 1 if _json(pool) == "prefork" else int(_json(concurrency) or 1)
    return total


def _json(value: str | None) -> Any:
    try:
        return json.loads(value) if value is not None else None
    except ValueError:
        return value


def send_released(gate: FairGate, store: Any, celery: TaskSender, queue: str) -> list[str]:
    """Release ``queue``'s due jobs and send their messages (the job's task by its type; its
    model, for the worker's model guard); a failed send leaves the job to the sweeper."""
    sent = []
    for job_id in gate.release(queue):
        record = store.get(job_id)
        model = record.request.get("model")
        celery.send_task(tasks.TASK_FOR_JOB_TYPE[record.type], args=[job_id], task_id=job_id, queue=queue,
                         **({"kwargs": {"model": model}} if model else {}))
        store.mark_dispatched(job_id)
        sent.append(job_id)
    return sent


def release_queues(gate: FairGate, store: Any, celery: TaskSender, queues: list[str] | None = None) -> int:
    """:func:`send_released` for each of ``queues`` (every queue with held jobs when None);
    returns how many were sent. Best effort: held jobs stay held, and a released job whose
    send failed is the sweeper's (it counts as undispatched)."""
    sent = 0
    for queue in gate.held_queues() if queues is None else queues:
        try:
            sent += len(send_released(gate, store, celery, queue))
        except Exception as exc:  # noqa: BLE001 - a later start, end or reaper tick releases them
            log_event(logger, "gate_release_failed", level=logging.WARNING, queue=queue, error=type(exc).__name__)
    return sent
