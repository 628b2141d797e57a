"""The job protocol: create, start, stream events, cancel and finish jobs in Redis.

Both sides use :class:`JobStore`: the web creates jobs and reads them, the worker starts
attempts, appends events and finishes them. Transitions are Lua scripts
(:mod:`core.scripts`) so each one is atomic.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import redis

from core import keys, scripts
from core.events import (
    CANCELLED,
    QUEUED,
    TERMINAL_EVENT_FOR_STATE,
    TERMINAL_STATES,
    Event,
)
from core.fair_gate import FairGate
from core.models import model_queues
from core.payloads import event_summary, stored_payload

JOB_TYPES = ("generate", "agent", "chat", "completion", "bench")


class JobNotFound(KeyError):
    """No job with this id (or not visible to this owner)."""


@dataclass
class JobRecord:
    """A job as stored in its Redis hash; dict-valued fields are JSON in Redis."""

    id: str
    type: str
    state: str
    queue: str
    created_at: float
    request: dict[str, Any]
    attempt: int = 0
    max_attempts: int = 3
    dispatch: int = 0  # bumped when a job is re-sent; older task messages are then stale
    last_seq: int = 0
    owner: str = ""
    worker: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    deadline: float | None = None  # unix seconds: queued then -> ``expired``; running -> ``timeout``
    webhook_url: str | None = None  # POSTed the job's record once it ends (core/webhooks.py)

    _JSON_FIELDS = ("request", "result", "error")
    _INT_FIELDS = ("attempt", "max_attempts", "last_seq", "dispatch")
    _FLOAT_FIELDS = ("created_at", "started_at", "finished_at", "deadline")

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def to_redis(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in self.__dict__.items():
            if value is None:
                continue
            out[name] = json.dumps(value, ensure_ascii=False) if name in self._JSON_FIELDS else str(value)
        return out

    @classmethod
    def from_redis(cls, raw: dict[str, str]) -> "JobRecord":
        values: dict[str, Any] = {}
        for name in cls.__dataclass_fields__:
            if name not in raw:
                continue
            text = raw[name]
            if name in cls._JSON_FIELDS:
                values[name] = json.loads(text)
            elif name in cls._INT_FIELDS:
                values[name] = int(text)
            elif name in cls._FLOAT_FIELDS:
                values[name] = float(text)
            else:
                values[name] = text
        return cls(**values)

    def public_view(self) -> dict[str, Any]:
        """What clients see (the owner stays private)."""
        view = {k: v for k, v in self.__dict__.items() if k != "owner"}
        return view


@dataclass(frozen=True)
class StartedAttempt:
    """Outcome of :meth:`JobStore.start_attempt`."""

    attempt: int  # 0: job already ended, do nothing; -1: attempts exhausted, job failed
    seq: int
    record: JobRecord | None = None  # the job as it started (state running), when it did

    @property
    def should_run(self) -> bool:
        return self.attempt > 0


def _pairs(flat: list[Any]) -> dict[str, str]:
    """A Lua ``HGETALL`` reply (field, value, field, value, ...) as a dict of strings."""
    text = [item.decode() if isinstance(item, bytes) else str(item) for item in flat]
    return dict(zip(text[::2], text[1::2]))


def _event_body(event_type: str, attempt: int | str, ts: float, data_json: str) -> str:
    return f'"type": {json.dumps(event_type)}, "attempt": {attempt}, "ts": {ts!r}, "data": {data_json}}}'


def estimated_start(ahead: int, starts: list[float], now: float, window_s: float = 3600) -> float | None:
    """When a job with ``ahead`` jobs before it should start: one start per measured interval
    (the queue's recent ``starts``), the next one counted from the last start. None without
    two starts in ``window_s``."""
    recent = sorted(t for t in starts if now - t <= window_s)
    if len(recent) < 2 or recent[-1] <= recent[0]:
        return None
    interval = (recent[-1] - recent[0]) / (len(recent) - 1)
    return max(now, recent[-1] + interval * (ahead + 1))


def new_job_id() -> keys.JobId:
    return keys.JobId(uuid.uuid4().hex)


@dataclass
class JobStore:
    """Reads and writes jobs in Redis. Cheap to create; share one per process."""

    client: redis.Redis
    ttl_s: int = 7 * 24 * 3600
    _scripts: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in ("CREATE", "SWEEP_UNDISPATCHED", "APPEND_EVENT", "START_ATTEMPT", "FINISH", "REQUEUE",
                     "EXPIRE_QUEUED", "LINE_JOIN"):
            self._scripts[name] = self.client.register_script(getattr(scripts, name))

    # ---- creating and reading ----------------------------------------------------------
    def create(self, job_type: str, queue: str, request: dict[str, Any], *, owner: str = "",
               max_attempts: int = 3, job_id: str | None = None, deadline: float | None = None,
               webhook_url: str | None = None) -> JobRecord:
        """Store a new ``queued`` job. It counts as *undispatched* until :meth:`mark_dispatched`
        confirms its task message was sent (the reaper re-sends it otherwise)."""
        record = self._new_record(job_type, queue, request, owner, max_attempts, job_id)
        record.deadline, record.webhook_url = deadline, webhook_url
        self._create(record, [], "")
        return record

    def create_idempotent(self, job_type: str, queue: str, request: dict[str, Any], *, idempotency_key: str,
                          owner: str = "", max_attempts: int = 3, deadline: float | None = None,
                          webhook_url: str | None = None) -> tuple[JobRecord, bool]:
        """Like :meth:`create`, with the client's ``Idempotency-Key`` set in the same atomic
        step; returns (job, replayed): an earlier submission's job when the key names one."""
        idem = keys.idempotency_key(owner or "-", idempotency_key)
        record = self._new_record(job_type, queue, request, owner, max_attempts, None)
        record.deadline, record.webhook_url = deadline, webhook_url
        while True:
            seen = self.client.get(idem) or ""
            earlier = self._existing(seen, owner)
            if earlier is not None:
                return earlier, True
            winner = self._create(record, [idem], seen)
            if winner == record.id:
                return record, False
            # another request with the same key won the race between our GET and the script

    def idempotent_job(self, idempotency_key: str, owner: str = "") -> JobRecord | None:
        """The job an earlier submission with this key created, if it still exists."""
        return self._existing(self.client.get(keys.idempotency_key(owner or "-", idempotency_key)) or "", owner)

    def forget_idempotency(self, idempotency_key: str, owner: str = "") -> None:
        self.client.delete(keys.idempotency_key(owner or "-", idempotency_key))

    def _existing(self, job_id: str, owner: str) -> JobRecord | None:
        if not job_id:
            return None
        try:
            return self.get(job_id, owner=owner)
        except JobNotFound:  # the job expired (or the key is stale): the key may be taken over
            return None

    @staticmethod
    def _new_record(job_type: str, queue: str, request: dict[str, Any], owner: str, max_attempts: int,
                    job_id: str | None) -> JobRecord:
        record_id = keys.JobId(job_id) if job_id else new_job_id()
        return JobRecord(id=record_id, type=job_type, state=QUEUED, queue=queue, created_at=time.time(),
                         request=request, owner=owner, max_attempts=max_attempts)

    def _create(self, record: JobRecord, idem: list[str], seen: str) -> str:
        fields = [item for pair in record.to_redis().items() for item in pair]
        return str(self._scripts["CREATE"](
            keys=[keys.job_key(record.id), keys.JOBS_INDEX, keys.UNDISPATCHED, keys.DEADLINES, *idem],
            args=[record.id, repr(record.created_at), self.ttl_s, seen,
                  "" if record.deadline is None else repr(record.deadline), *fields]))

    # ---- dispatch: every queued job has a task message, or the sweeper sends one ---------
    def mark_dispatched(self, job_id: str, queue: str | None = None) -> None:
        """The job's task message was sent (to ``queue``, whose line it then joins); it is
        *pending* until an attempt starts (:mod:`core.deliveries` finds messages stranded on
        the way)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(keys.UNDISPATCHED, job_id)
        pipe.zadd(keys.PENDING, {job_id: time.time()})
        pipe.execute()
        if queue:
            self._scripts["LINE_JOIN"](keys=[keys.job_key(job_id), keys.line_key(queue), keys.line_starts_key(queue),
                                             keys.LINE_SEQ], args=[job_id])

    def place_in_line(self, job_id: str) -> tuple[int, float | None] | None:
        """(jobs ahead of it in its queue, when it is expected to start) for a queued job
        whose message was sent or that waits at the fair gate, else None. The estimate: the
        queue's service rate over its last starts (up to 64, within the last hour); None until
        two have been seen."""
        line, starts_key, held = self.client.hmget(keys.job_key(job_id), ["line", "line_starts", "held"])
        if held:
            place = FairGate(self.client, 0).held_place(job_id)
            if place is None:
                return None
            rank, starts_key = place.ahead, keys.line_starts_key(place.queue)
        elif not line or not starts_key:
            return None
        else:
            rank = self.client.zrank(line, job_id)
            if rank is None:
                return None
        starts = self.client.zrange(starts_key, 0, -1, withscores=True)
        return int(rank), estimated_start(int(rank), [t for _, t in starts], time.time())

    def undispatched(self, older_than_s: float, now: float | None = None, limit: int = 100) -> list[str]:
        """Queued jobs whose task message was not confirmed sent within ``older_than_s``."""
        cutoff = (time.time() if now is None else now) - older_than_s
        return list(self.client.zrangebyscore(keys.UNDISPATCHED, "-inf", cutoff, start=0, num=limit))

    def sweep_undispatched(self, job_id: str, max_redispatches: int) -> int:
        """New dispatch number to re-send the job with; -1 when it was failed instead
        (``enqueue_failed``, past ``max_redispatches``); 0 when it needs nothing. The job
        counts as undispatched (and no longer pending) until the re-send is confirmed."""
        self.client.zrem(keys.PENDING, job_id)
        return int(self._scripts["SWEEP_UNDISPATCHED"](
            keys=self._job_keys(job_id) + [keys.UNDISPATCHED, keys.WEBHOOK_OUTBOX, keys.DEADLINES],
            args=[job_id, repr(time.time()), self.ttl_s, max_redispatches]))

    def get(self, job_id: str, owner: str | None = None) -> JobRecord:
        """The job, or :class:`JobNotFound`; with ``owner`` given, other owners' jobs are hidden.
        Text that is not a job id's shape is not found either (no key is built from it)."""
        try:
            key = keys.job_key(job_id)
        except keys.InvalidJobId:
            raise JobNotFound(job_id) from None
        raw = self.client.hgetall(key)
        if not raw:
            raise JobNotFound(job_id)
        record = JobRecord.from_redis(raw)
        if owner is not None and record.owner != owner:
            raise JobNotFound(job_id)
        return record

    def list(self, *, state: str | None = None, job_type: str | None = None,
             owner: str | None = None, limit: int = 50) -> list[JobRecord]:
        """Most recent first; scans a bounded window of the index and drops expired ids."""
        ids = self.client.zrevrange(keys.JOBS_INDEX, 0, max(limit * 20, 200) - 1)
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(keys.job_key(job_id))
        jobs, expired = [], []
        for job_id, raw in zip(ids, pipe.execute()):
            if not raw:
                expired.append(job_id)
                continue
            record = JobRecord.from_redis(raw)
            if (state and record.state != state) or (job_type and record.type != job_type):
                continue
            if owner is not None and record.owner != owner:
                continue
            jobs.append(record)
            if len(jobs) >= limit:
                break
        if expired:
            self.client.zrem(keys.JOBS_INDEX, *expired)
        return jobs

    def events(self, job_id: str, after_seq: int = 0, count: int | None = None) -> list[Event]:
        """Stored events with seq greater than ``after_seq``, in order."""
        entries = self.client.xrange(keys.events_key(job_id), min=f"(0-{after_seq}", max="+", count=count)
        return [Event.from_stream_fields(fields) for _, fields in entries]

    def wait_events(self, job_id: str, after_seq: int, block_ms: int) -> list[Event]:
        """Like :meth:`events`, but blocks up to ``block_ms`` for new ones."""
        reply = self.client.xread({keys.events_key(job_id): f"0-{after_seq}"}, block=block_ms)
        if not reply:
            return []
        return [Event.from_stream_fields(fields) for _, fields in reply[0][1]]

    def follow(self, job_id: str, after_seq: int = 0, block_ms: int = 1000,
               idle_timeout_s: float | None = None) -> Iterator[Event | None]:
        """Replay then tail events until the terminal one; yields ``None`` on idle ticks
        (so a caller can send keep-alives or notice a disconnect)."""
        last, idle_since = after_seq, time.monotonic()
        batch = self.events(job_id, after_seq)
        while True:
            for event in batch:
                last, idle_since = event.seq, time.monotonic()
                yield event
                if event.is_terminal:
                    return
            if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                return
            batch = self.wait_events(job_id, last, block_ms)
            if not batch:
                yield None

    # ---- the worker's side ---------------------------------------------------------------
    def start_attempt(self, job_id: str, worker: str, lease_s: int, dispatch: int = 0) -> StartedAttempt:
        now = time.time()
        reply = self._scripts["START_ATTEMPT"](
            keys=self._job_keys(job_id) + [keys.LEASES, keys.UNDISPATCHED, keys.PENDING, keys.WEBHOOK_OUTBOX,
                                           keys.DEADLINES],
            args=[job_id, worker, repr(now), repr(now + lease_s), self.ttl_s, dispatch],
        )
        record = JobRecord.from_redis(_pairs(reply[2])) if len(reply) > 2 else None
        return StartedAttempt(int(reply[0]), int(reply[1]), record)

    def append_event(self, job_id: str, attempt: int, event_type: str, data: dict[str, Any]) -> int:
        """Append one event; returns its seq, or a negative code when the attempt is no
        longer current (job ended: -1, unknown: -2, stale attempt: -3)."""
        ts = time.time()
        data_json = json.dumps(data, ensure_ascii=False)
        return int(self._scripts["APPEND_EVENT"](
            keys=self._job_keys(job_id),
            args=[event_type, attempt, repr(ts), data_json, _event_body(event_type, attempt, ts, data_json), self.ttl_s],
        ))

    def finish(self, job_id: str, state: str, payload: dict[str, Any], attempt: int | None = None,
               keep_token_ids: bool = False) -> int:
        """Move the job to a terminal ``state`` with its one terminal event.

        ``payload`` is the result (succeeded) or the error (otherwise), stored in the job's
        hash (without ``token_ids`` unless ``keep_token_ids``); the terminal event carries a
        summary of it (:mod:`core.payloads`). Returns the event's seq, or 0 when the job had
        already ended (or ``attempt`` is stale): the caller lost the race and must not report again.
        """
        if state not in TERMINAL_STATES:
            raise ValueError(f"not a terminal state: {state}")
        ts = time.time()
        event_type = TERMINAL_EVENT_FOR_STATE[state]
        stored = stored_payload(payload, keep_token_ids)
        data_json = json.dumps(stored, ensure_ascii=False)
        summary_json = json.dumps(event_summary(stored), ensure_ascii=False)
        field_name = "result" if state == "succeeded" else "error"
        return int(self._scripts["FINISH"](
            keys=self._job_keys(job_id) + [keys.LEASES, keys.WEBHOOK_OUTBOX, keys.DEADLINES],
            args=[job_id, state, event_type, "" if attempt is None else attempt, repr(ts), data_json,
                  self.ttl_s, field_name, summary_json],
        ))

    def expire_overdue(self, now: float | None = None, limit: int = 100) -> list[str]:
        """The deadline sweep: end ``expired`` every queued job whose deadline has passed (one
        script each, so a worker starting the job at the same moment either runs it or finds
        it ended). Returns the ids it ended."""
        now = time.time() if now is None else now
        due = self.client.zrangebyscore(keys.DEADLINES, "-inf", now, start=0, num=limit)
        expired = []
        for job_id in due:
            try:
                job_keys = self._job_keys(job_id)
            except keys.InvalidJobId:
                self.client.zrem(keys.DEADLINES, job_id)
                continue
            if int(self._scripts["EXPIRE_QUEUED"](
                    keys=job_keys + [keys.DEADLINES, keys.UNDISPATCHED, keys.PENDING, keys.WEBHOOK_OUTBOX],
                    args=[job_id, repr(now), self.ttl_s])):
                expired.append(job_id)
        return expired

    def renew_lease(self, job_id: str, lease_s: int) -> None:
        """Push the lease deadline on; the job's record and stream keep their TTL from now,
        so a job that runs longer than ``ttl_s`` never expires under its worker."""
        if self.client.zadd(keys.LEASES, {job_id: time.time() + lease_s}, xx=True, ch=True):
            pipe = self.client.pipeline(transaction=False)
            pipe.expire(keys.job_key(job_id), self.ttl_s)
            pipe.expire(keys.events_key(job_id), self.ttl_s)
            pipe.execute()

    def drop_lease(self, job_id: str) -> None:
        self.client.zrem(keys.LEASES, job_id)

    def expired_leases(self, now: float | None = None) -> list[str]:
        return list(self.client.zrangebyscore(keys.LEASES, "-inf", now or time.time()))

    def requeue(self, job_id: str, attempt: int, reason: str = "lease_expired") -> int:
        """Put a running job whose attempt died back to ``queued`` (``reason``: its lease
        expired, or its worker stopped beating); returns the new dispatch number to re-send
        the task with, or 0 when the job was no longer running that attempt."""
        return int(self._scripts["REQUEUE"](
            keys=self._job_keys(job_id) + [keys.LEASES, keys.UNDISPATCHED],
            args=[job_id, attempt, repr(time.time()), self.ttl_s, reason],
        ))

    def trim_index(self, batch: int = 500, max_batches: int = 20) -> int:
        """Drop the oldest ids of ``jobs:index`` whose record has expired; returns how many.

        Records expire on their own (TTL) but the index is a sorted set: without this, every
        job ever created would stay in it. Works from the oldest end and stops at the first
        batch that still holds a live job."""
        removed = 0
        for _ in range(max_batches):
            ids = self.client.zrange(keys.JOBS_INDEX, 0, batch - 1)
            if not ids:
                break
            pipe = self.client.pipeline(transaction=False)
            for job_id in ids:
                pipe.exists(keys.job_key(job_id))
            gone = [job_id for job_id, alive in zip(ids, pipe.execute()) if not alive]
            if gone:
                removed += self.client.zrem(keys.JOBS_INDEX, *gone)
            if len(gone) < len(ids):
                break
        return removed

    # ---- cancellation -------------------------------------------------------------------
    def request_cancel(self, job_id: str) -> JobRecord:
        """Raise the cancel flag and tell the workers (one message on ``keys.CANCELS``: the
        running job's worker stops it between two tokens); a queued job ends ``cancelled`` at
        once (its task will skip)."""
        record = self.get(job_id)
        if record.is_terminal:
            return record
        pipe = self.client.pipeline(transaction=True)
        pipe.set(keys.cancel_key(job_id), "1", ex=self.ttl_s)
        pipe.publish(keys.CANCELS, record.id)
        pipe.execute()
        if record.state == QUEUED:
            self.finish(job_id, CANCELLED, {"reason": "cancelled while queued"})
        return self.get(job_id)

    def cancel_requested(self, job_id: str) -> bool:
        return bool(self.client.exists(keys.cancel_key(job_id)))

    # ---- helpers ------------------------------------------------------------------------
    @staticmethod
    def _job_keys(job_id: str) -> list[str]:
        return [keys.job_key(job_id), keys.events_key(job_id), keys.live_channel(job_id)]

    def ping(self) -> bool:
        """Redis answers (raises redis' ConnectionError / TimeoutError when it does not)."""
        return bool(self.client.ping())

    def queue_depths(self) -> dict[str, int]:
        """Jobs waiting in each shared queue and in each queue of a model seen lately: messages
        in its Celery list, plus jobs held at its fair gate (core/fair_gate.py)."""
        queues = [*keys.QUEUES, *model_queues(self.client)]
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            pipe.llen(keys.queue_key(queue))
        held = self.client.hgetall(keys.HELD_COUNTS)  # jobs waiting at the fair gate count too
        return {queue: n + int(held.get(queue, 0)) for queue, n in zip(queues, pipe.execute())}
