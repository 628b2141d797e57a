"""Notices jobs whose worker died with them (main process and pool), via missing heartbeats
and expired leases, and queued jobs whose task message was never sent.

When a worker is lost nobody re-delivers its message until the broker's visibility timeout
(an hour-scale wait). Its heartbeats stop: a running job whose worker has not beaten for
``MINISERVE_WORKER_DEAD_S`` (three beats) is re-queued, and its next attempt continues the
answer where the stream stopped (worker/resume.py). The lease stays as the fence (a stale
attempt can write nothing) and as the backstop for a worker that beats but whose job
thread is stuck: an expired lease re-queues the job too. Every worker's main process runs this loop; the
requeue is atomic, so two reapers never re-send the same job twice. The same loop trims
expired ids from the jobs index (records expire by TTL; the index would not).

**Fair after an outage.** While Redis is unreachable no worker can renew a lease or beat,
so when it comes back every lease looks expired and every worker dead. The reaper therefore
reaps only after it has been in touch with Redis, without a gap, for a grace period: one
lease for expired leases, ``MINISERVE_WORKER_DEAD_S`` for missing heartbeats (a live
worker beats again within one beat of Redis coming back). A failed tick, a tick whose Redis
call was held up by reconnect retries, or a stalled loop restarts that clock.
Meanwhile live workers renew (the lease keeper retries every second after a failed
renewal), so only leases of attempts that really died are still expired when reaping
resumes. The same clock holds back the sweeper.

**The sweeper.** A job is created ``queued`` and counts as undispatched until the sender
confirms its task message went out. A job still undispatched after one lease (the web or a
reaper died between creating it and sending its task, or Redis failed at that moment) is
re-sent with a new dispatch number (a message that did go out becomes stale, so the job
still runs once); after ``MINISERVE_MAX_ATTEMPTS`` re-sends it ends ``failed`` with
``enqueue_failed``. Every action is logged with its reason. Re-sending rather than failing:
the client may have received its 202 (or will get this job back through its
``Idempotency-Key``), so running the job is what it expects.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from celery import Celery

from core import tasks as names
from core.deliveries import stranded_jobs
from core.events import RUNNING
from core.fair_gate import FairGate, release_queues
from core.jobs import JobNotFound, JobStore
from core.logs import log_event
from core.routing import rescue_orphans
from core.workers import jobs_of_dead_workers
from core.webhooks import WebhookStore, task_sender

logger = logging.getLogger("miniserve.reaper")
SLOW_CALL_S = 1.0  # a ping slower than this rode out a reconnect: the contact clock restarts


@dataclass
class Reaper:
    """The reaper loop's state: since when it has been in unbroken contact with Redis."""

    store: JobStore
    celery_app: Celery
    lease_s: float
    interval_s: float
    max_redispatches: int = 3
    grace_s: float | None = None  # default: one lease
    webhooks: WebhookStore | None = None  # drains the webhook outbox each tick (core/webhooks.py)
    gate_settings: Any = None  # releases held jobs each tick (core/fair_gate.py); None: not here
    dead_after_s: float | None = None  # re-queue jobs of workers silent this long; None: leases only
    clock: Callable[[], float] = time.monotonic  # the contact clock (a test steps its own)
    _contact_since: float | None = field(default=None, init=False)
    _last_ok: float | None = field(default=None, init=False)

    @property
    def grace(self) -> float:
        return self.lease_s if self.grace_s is None else self.grace_s

    def tick(self) -> dict[str, list[str]]:
        """One pass: check contact; end queued jobs past their deadline and send due webhooks
        (both safe at any time: each is one atomic step); then, past the grace period, reap
        and sweep."""
        contact_s = self._contact_s()
        expire_overdue(self.store)
        if self.gate_settings is not None:  # held jobs whose turn came (core/fair_gate.py)
            release_queues(FairGate.from_settings(self.store.client, self.gate_settings), self.store, self.celery_app)
        if self.webhooks is not None:
            self.webhooks.dispatch(task_sender(self.celery_app))
        done: dict[str, list[str]] = {"requeued": [], "redispatched": []}
        if self.dead_after_s is not None and contact_s >= self.dead_after_s:
            dead = jobs_of_dead_workers(self.store.client, self.dead_after_s)
            done["requeued"] += reap_once(self.store, self.celery_app, dead, "worker_dead")
        if contact_s < self.grace:
            return done
        done["requeued"] += reap_once(self.store, self.celery_app)
        done["redispatched"] = sweep_once(self.store, self.celery_app, self.lease_s, self.max_redispatches)
        moved = rescue_orphans(self.store.client)  # routed jobs left in a dead worker's own queue
        if moved:
            log_event(logger, "routed_jobs_rescued", count=moved)
        self.store.trim_index()
        return done

    def lost_contact(self) -> None:
        self._contact_since = None

    def _contact_s(self) -> float:
        """Seconds of unbroken contact with Redis, this tick's ping included."""
        started = self.clock()
        self.store.ping()
        now = self.clock()
        gap = self._last_ok is not None and now - self._last_ok > 2 * self.interval_s + SLOW_CALL_S
        if self._contact_since is None or now - started > SLOW_CALL_S or gap:
            if self._contact_since is not None or self._last_ok is not None:
                log_event(logger, "reaper_contact_restarted", grace_s=self.grace,
                          ping_ms=round((now - started) * 1000, 1))
            self._contact_since = now
        self._last_ok = now
        return now - self._contact_since


def expire_overdue(store: JobStore) -> list[str]:
    """The deadline sweep: queued jobs past their deadline end ``expired``, unrun, even when no
    worker takes their message (a worker that does take it later skips it)."""
    expired = store.expire_overdue()
    for job_id in expired:
        log_event(logger, "job_expired", job_id=job_id, reason="deadline_passed_while_queued")
    return expired


def reap_once(store: JobStore, celery_app: Celery, job_ids: list[str] | None = None,
              reason: str = "lease_expired") -> list[str]:
    """Re-queue (or, past the attempt budget, let the next start fail) the jobs whose attempt
    died: ``job_ids`` (default: those whose lease expired)."""
    requeued = []
    for job_id in store.expired_leases() if job_ids is None else job_ids:
        try:
            record = store.get(job_id)
        except JobNotFound:
            store.drop_lease(job_id)
            continue
        dispatch = store.requeue(job_id, record.attempt, reason)
        if not dispatch:
            continue
        _send(store, celery_app, record.type, record.queue, job_id, dispatch)
        log_event(logger, "job_requeued", job_id=job_id, attempt=record.attempt, dispatch=dispatch,
                  reason=reason, worker=record.worker)
        requeued.append(job_id)
    return requeued


def requeue_if_holder_gone(store: JobStore, celery_app: Celery, job_id: str, node: str) -> bool:
    """A message re-delivered to this node found its job running: re-queue the job now when the
    attempt holding it ran in a process of this node that no longer exists.

    Why: Celery re-delivers a killed pool child's message (the out-of-memory killer, a SIGKILL)
    to its replacement as soon as that has loaded the model, but the job stays ``running`` under
    the dead child's lease, so that start is skipped, and the job waited for the reaper to miss
    the child's heartbeats (``MINISERVE_WORKER_DEAD_S``, 15 s). The holder is ``node:pid`` (the
    worker field); a pid that still exists, or one of another node, is left to the reaper (a
    reused pid only makes it wait as before)."""
    try:
        record = store.get(job_id)
    except JobNotFound:
        return False
    holder_node, _, pid = record.worker.rpartition(":")
    if record.state != RUNNING or holder_node != node or not pid.isdigit() or _process_exists(int(pid)):
        return False
    return bool(reap_once(store, celery_app, [job_id], reason="process_lost"))


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process now has that pid
    return True


def sweep_once(store: JobStore, celery_app: Celery, older_than_s: float, max_redispatches: int) -> list[str]:
    """Re-send (or, past the budget, fail) queued jobs whose task message was never confirmed
    sent, or was stranded on its way to a worker (:mod:`core.deliveries`)."""
    redispatched = []
    unsent = store.undispatched(older_than_s)
    stranded = stranded_jobs(store, 2 * older_than_s)
    for job_id in unsent + [j for j in stranded if j not in unsent]:
        dispatch = store.sweep_undispatched(job_id, max_redispatches)
        if dispatch == 0:
            continue
        if dispatch < 0:
            log_event(logger, "job_failed_undispatched", level=logging.WARNING, job_id=job_id,
                      reason="task message never sent", redispatches=max_redispatches)
            continue
        record = store.get(job_id)
        _send(store, celery_app, record.type, record.queue, job_id, dispatch)
        log_event(logger, "job_redispatched", level=logging.WARNING, job_id=job_id, dispatch=dispatch,
                  reason="task message stranded" if job_id in stranded else "task message never confirmed sent")
        redispatched.append(job_id)
    return redispatched


def _send(store: JobStore, celery_app: Celery, job_type: str, queue: str, job_id: str, dispatch: int) -> None:
    celery_app.send_task(names.TASK_FOR_JOB_TYPE[job_type], args=[job_id, dispatch], task_id=job_id, queue=queue)
    store.mark_dispatched(job_id, queue)


def start_reaper(store: JobStore, celery_app: Celery, interval_s: float, lease_s: float,
                 max_redispatches: int = 3, webhooks: WebhookStore | None = None,
                 gate_settings: Any = None, dead_after_s: float | None = None) -> threading.Event:
    """Run :meth:`Reaper.tick` every ``interval_s`` in a daemon thread; set the event to stop."""
    stop = threading.Event()
    reaper = Reaper(store, celery_app, lease_s, interval_s, max_redispatches, webhooks=webhooks,
                    gate_settings=gate_settings, dead_after_s=dead_after_s)

    def loop() -> None:
        while not stop.wait(interval_s):
            try:
                reaper.tick()
            except Exception as exc:  # noqa: BLE001 - Redis blips must not kill the reaper
                reaper.lost_contact()
                log_event(logger, "reaper_failed", level=logging.WARNING, error=type(exc).__name__)

    threading.Thread(target=loop, name="miniserve-reaper", daemon=True).start()
    return stop
