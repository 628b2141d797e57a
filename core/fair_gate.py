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

import time
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from core import keys, tasks
from core.priorities import PRIORITY_CLASSES

# KEYS: job, line, line_starts, seq, held_queues, held_counts, owners, held, undispatched,
# queued_by_owner. ARGV: job_id, window, queue, owner. Returns 1: send now (the job joined the
# line), 0: held, -1: the job is no longer queued.
ADMIT = """
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' then return -1 end
redis.call('HSET', KEYS[1], 'queued_owner', ARGV[4])
redis.call('HINCRBY', KEYS[10], ARGV[4], 1)
if redis.call('SISMEMBER', KEYS[5], ARGV[3]) == 0 and redis.call('ZCARD', KEYS[2]) < tonumber(ARGV[2]) then
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
# per class, most urgent first. ARGV: queue, window, held prefix, job key prefix, now, the
# class names in KEYS' order. Returns the released job ids, in release order.
RELEASE = """
local released = {}
local room = tonumber(ARGV[2]) - redis.call('ZCARD', KEYS[1])
local left = 0
for c = 1, #KEYS - 6 do
  local owners = KEYS[6 + c]
  while room > 0 do
    local owner = redis.call('LMOVE', owners, owners, 'LEFT', 'RIGHT')
    if not owner then break end
    local held = ARGV[3] .. ARGV[5 + c] .. ':owner:' .. owner
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

    def __init__(self, client: redis.Redis, window: int) -> None:
        self.client = client
        self.window = window
        self._admit = client.register_script(ADMIT)
        self._release = client.register_script(RELEASE)

    def admit(self, job_id: str, queue: str, priority: str, owner: str) -> int:
        """1: send the job's message now (it joined the line); 0: held; -1: not queued any more."""
        window = self.window if self.window > 0 else 2**31
        return int(self._admit(
            keys=[keys.job_key(job_id), keys.line_key(queue), keys.line_starts_key(queue), keys.LINE_SEQ,
                  keys.HELD_QUEUES, keys.HELD_COUNTS, keys.held_owners_key(queue, priority),
                  keys.held_key(queue, priority, owner), keys.UNDISPATCHED, keys.QUEUED_BY_OWNER],
            args=[job_id, window, queue, owner]))

    def release(self, queue: str, now: float | None = None) -> list[str]:
        """Held jobs of ``queue`` whose turn came, as many as the window has room for: each
        joined the line and counts as undispatched until its message is confirmed sent."""
        window = self.window if self.window > 0 else 2**31
        return list(self._release(
            keys=[keys.line_key(queue), keys.line_starts_key(queue), keys.LINE_SEQ, keys.HELD_QUEUES,
                  keys.HELD_COUNTS, keys.UNDISPATCHED,
                  *(keys.held_owners_key(queue, c) for c in PRIORITY_CLASSES)],
            args=[queue, window, keys.held_prefix(queue), keys.JOB_KEY_PREFIX,
                  repr(time.time() if now is None else now), *PRIORITY_CLASSES]))

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
        prefix, _, owner = held.partition(":owner:")
        queue, _, priority = prefix[len("held:"):].rpartition(":")
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
