"""Cancellation by message: one subscription per worker process instead of a poll per job.

A cancel raises the job's flag and publishes its id on ``keys.CANCELS`` in one step
(:meth:`core.jobs.JobStore.request_cancel`). Each worker process keeps one pub/sub
connection; a message for one of its running jobs sets that job's :class:`threading.Event`,
which the job thread reads between tokens (no Redis call per token, nor per job every 50 ms).

Pub/sub is fire and forget, so the flag stays the record and three checks make sure none is
missed: a job looks at its flag once when it is registered (a cancel published before then);
every (re)subscription is followed by a check of all running jobs' flags (cancels published
while the connection was down or not yet up); and while jobs run, one pipelined check of all
their flags every :data:`SWEEP_S` (a backstop whatever else went wrong: one round trip per
process per second, not twenty per job).
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import redis

from core import keys
from core.logs import log_event

logger = logging.getLogger("miniserve.worker")
SWEEP_S = 1.0
RETRY_S = 1.0


class CancelWatch:
    """The running jobs of one process and the one thread that hears their cancels."""

    def __init__(self, client: redis.Redis, sweep_s: float = SWEEP_S) -> None:
        self.client = client
        self.sweep_s = sweep_s
        self._jobs: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.subscribed = threading.Event()  # the subscription is up (tests wait on it)
        self.sweeps = 0

    @contextmanager
    def watching(self, job_id: str) -> Iterator[threading.Event]:
        """The job's cancel event while the block runs (set when a cancel arrives)."""
        event = threading.Event()
        with self._lock:
            self._jobs[job_id] = event
        self._ensure_thread()
        try:
            if self.client.exists(keys.cancel_key(job_id)):  # cancelled before it was registered
                event.set()
            yield event
        finally:
            with self._lock:
                self._jobs.pop(job_id, None)

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="miniserve-cancels", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        pubsub: Any = None
        last_sweep = time.monotonic()
        while True:
            try:
                if pubsub is None:
                    pubsub = self.client.pubsub()
                    pubsub.subscribe(keys.CANCELS)
                message = pubsub.get_message(timeout=self.sweep_s)
                if message is not None:
                    self._on_message(message)
                if time.monotonic() - last_sweep >= self.sweep_s:
                    last_sweep = time.monotonic()
                    self.sweep()
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any Redis trouble
                self.subscribed.clear()
                log_event(logger, "cancel_watch_failed", level=logging.WARNING, error=type(exc).__name__)
                pubsub = _closed(pubsub)
                time.sleep(RETRY_S)

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "subscribe":  # (re)subscribed: what was published meanwhile is in the flags
            self.subscribed.set()
            self.sweep()
        elif kind == "message":
            data = message.get("data")
            job_id = data.decode() if isinstance(data, bytes) else str(data)
            with self._lock:
                event = self._jobs.get(job_id)
            if event is not None:
                event.set()

    def sweep(self) -> None:
        """One pipelined look at every running job's flag."""
        with self._lock:
            jobs = list(self._jobs.items())
        if not jobs:
            return
        pipe = self.client.pipeline(transaction=False)
        for job_id, _ in jobs:
            pipe.exists(keys.cancel_key(job_id))
        for (_, event), raised in zip(jobs, pipe.execute()):
            if raised:
                event.set()
        self.sweeps += 1


def _closed(pubsub: Any) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except Exception:  # noqa: BLE001 - it is being thrown away
            pass
    return None
