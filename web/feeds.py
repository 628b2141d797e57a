"""One Redis reader per followed job per web process, shared by all of its SSE streams.

Measured with a subscriber per stream doing its own ``XREAD``: at 2,000 streams on 20 jobs
the two web processes spent their CPU on 2,000 ``XREAD`` round trips and parses a second
and stopped accepting new connections (the listen queue grew past 1,400, ``/healthz``
timed out at 30 s). A :class:`JobFeed` reads the job's stream once, formats each event
once, and wakes every waiting stream of that job; a stream's own Redis work is its replay
(``XRANGE``) and nothing more, so a stream holds no Redis connection while it waits.

Plain ``threading`` primitives: under the gevent worker they are patched into greenlet
ones, and under Flask's test client they are real threads; the code is the same.
"""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

import redis

from core.events import Event
from core.jobs import JobNotFound, JobStore

MAX_BUFFERED = 2048  # events a feed keeps; a stream further behind re-reads the gap from Redis


@dataclass
class Formatted:
    event: Event
    text: str  # the SSE frame, formatted once for every stream


@dataclass
class JobFeed:
    """Events of one job with seq > ``start``, in order, as one ``XREAD`` loop reads them."""

    store: JobStore
    job_id: str
    start: int  # the buffer holds events after this seq
    block_ms: int
    buffer: list[Formatted] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)  # buffer's seqs, for bisect
    done: bool = False  # terminal event read, job gone, or Redis lost: no more events come
    redis_lost: bool = False
    readers: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def last(self) -> int:
        return self.buffer[-1].event.seq if self.buffer else self.start

    def after(self, seq: int) -> list[Formatted] | None:
        """Buffered events after ``seq``; ``None`` when some were already dropped (read the
        gap from Redis)."""
        if seq < self.start:
            return None
        if self.last <= seq:
            return []
        return self.buffer[bisect.bisect_right(self.seqs, seq):]  # every stream wakes per event: no scan

    def wait(self, seq: int, timeout_s: float) -> None:
        with self.changed:
            if not self.done and self.last <= seq:
                self.changed.wait(timeout_s)

    def _add(self, events: list[Event], format_event) -> None:
        with self.changed:
            fresh = [Formatted(e, format_event(e)) for e in events if e.seq > self.last]
            self.buffer.extend(fresh)
            self.seqs.extend(item.event.seq for item in fresh)
            if len(self.buffer) > MAX_BUFFERED:
                cut = len(self.buffer) - MAX_BUFFERED // 2
                self.start = self.seqs[cut - 1]
                self.buffer, self.seqs = self.buffer[cut:], self.seqs[cut:]
            self.done = self.done or any(e.is_terminal for e in events)
            self.changed.notify_all()

    def _end(self, redis_lost: bool = False) -> None:
        with self.changed:
            self.done, self.redis_lost = True, redis_lost
            self.changed.notify_all()


class FeedHub:
    """The feeds of one web process: a stream joins its job's feed (starting one if none
    runs) and leaves it when it ends; a feed without readers stops at its next tick."""

    def __init__(self, store: JobStore, format_event) -> None:
        self.store, self.format_event = store, format_event
        self.feeds: dict[str, JobFeed] = {}
        self.lock = threading.Lock()

    def join(self, job_id: str, after: int, block_ms: int) -> JobFeed:
        with self.lock:
            feed = self.feeds.get(job_id)
            if feed is None or feed.done:
                feed = self.feeds[job_id] = JobFeed(self.store, job_id, after, block_ms)
                threading.Thread(target=self._run, args=(feed,), daemon=True, name=f"feed-{job_id}").start()
            feed.readers += 1
            return feed

    def leave(self, feed: JobFeed) -> None:
        with self.lock:
            feed.readers -= 1

    def _run(self, feed: JobFeed) -> None:
        try:
            while not feed.done and self._wanted(feed):
                events = self.store.wait_events(feed.job_id, feed.last, feed.block_ms)
                if events:
                    feed._add(events, self.format_event)
                elif self._over(feed):
                    feed._end()
        except (redis.ConnectionError, redis.TimeoutError):
            feed._end(redis_lost=True)
        finally:
            feed._end(redis_lost=feed.redis_lost)
            with self.lock:
                if self.feeds.get(feed.job_id) is feed:
                    del self.feeds[feed.job_id]

    def _wanted(self, feed: JobFeed) -> bool:
        """Whether anyone still reads; if not, the feed leaves the hub in the same locked
        step (a stream joining meanwhile starts a new feed instead of joining a dying one)."""
        with self.lock:
            if feed.readers > 0:
                return True
            feed.done = True
            if self.feeds.get(feed.job_id) is feed:
                del self.feeds[feed.job_id]
            return False

    def _over(self, feed: JobFeed) -> bool:
        """On an idle tick: the job expired, or ended with nothing after our last seq."""
        try:
            job = self.store.get(feed.job_id)
        except JobNotFound:
            return True
        return job.is_terminal and job.last_seq <= feed.last
