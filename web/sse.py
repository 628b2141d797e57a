"""Server-Sent Events of a job's stream, and waiting for a job's end.

Each event goes out as ``id: <seq>`` / ``event: <type>`` / ``data: <event JSON>``; the
stream replays stored events after the requested seq (its own ``XRANGE``), then follows
the job's feed, one ``XREAD`` loop per job per process that every stream of the job shares
(:mod:`web.feeds`), until the terminal event. Idle ticks send a ``: keep-alive`` comment,
which is also how a closed connection gets noticed.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import redis
from flask import Response, request, stream_with_context

from core.events import QUEUED, Event
from core.jobs import JobNotFound, JobRecord, JobStore
from core.logs import log_event
from web.errors import ApiError
from web.feeds import FeedHub, Formatted

logger = logging.getLogger("miniserve.web.sse")
RETRY_MS = 2000
LINE_POLL_S = 1.0  # a queued job's stream looks at its place in line this often
MAX_EVENT_SEQ = 2**63 - 1  # the largest seq a Last-Event-ID / ?after= may name
CHUNK_CHARS = 64 * 1024  # frames joined into one write up to about this size


def format_event(event: Event) -> str:
    return f"id: {event.seq}\nevent: {event.type}\ndata: {event.to_json()}\n\n"


def resume_point(after: int | None) -> int:
    """``?after=`` wins over the ``Last-Event-ID`` header; both mean "events with seq > n".

    A seq is at most :data:`MAX_EVENT_SEQ` (Redis stream ids are 64-bit): anything larger
    is a 400 here, checked before the stream starts, for running and finished jobs alike
    (Redis would refuse the id mid-stream and the connection would just drop)."""
    if after is not None:
        if after > MAX_EVENT_SEQ:
            raise ApiError(400, "bad_last_event_id", f"after: at most {MAX_EVENT_SEQ}", field="after")
        return after
    header = request.headers.get("Last-Event-ID", "").strip()
    if not header:
        return 0
    if not header.isdigit() or not header.isascii() or len(header) > 19 or int(header) > MAX_EVENT_SEQ:
        raise ApiError(400, "bad_last_event_id", "Last-Event-ID must be an event seq (an integer from 0 "
                       f"to {MAX_EVENT_SEQ})", field="Last-Event-ID")
    return int(header)


def stream_events(store: JobStore, job: JobRecord, after: int, keepalive_s: int,
                  feeds: FeedHub) -> Iterator[str]:
    """Replay (``XRANGE``), then follow the job's shared feed (:mod:`web.feeds`); ends after
    the terminal event, when the job is gone, or when Redis is. While the job is queued, a
    ``queued`` event tells its place in line each time it moves up (:class:`_Line`)."""
    yield f"retry: {RETRY_MS}\n\n"
    if job.is_terminal and after >= job.last_seq:
        return
    state, started = _Progress(after), time.perf_counter()
    line = _Line(store, job.id) if job.state == QUEUED else None
    try:
        yield from state.chunks(Formatted(e, format_event(e)) for e in store.events(job.id, after))
        if not state.ended:
            yield from _follow(store, job.id, state, keepalive_s, feeds, line)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        _redis_lost(job.id, type(exc).__name__)
    finally:
        log_event(logger, "sse_closed", job_id=job.id, events=state.sent,
                  duration_ms=round((time.perf_counter() - started) * 1000, 1))


@dataclass
class _Progress:
    last: int
    sent: int = 0
    ended: bool = False  # the terminal event went out

    def chunks(self, items: Iterable[Formatted]) -> Iterator[str]:
        """The frames of ``items``, up to the terminal one, joined into chunks of up to
        :data:`CHUNK_CHARS`: every event that is ready goes out in one write. Measured at
        1,000 streams, the socket sends were the web's largest cost; a replay of 20 events,
        or a stream woken late with several waiting, now costs one send instead of one each."""
        parts: list[str] = []
        size = 0
        for item in items:
            self.last, self.sent = item.event.seq, self.sent + 1
            parts.append(item.text)
            size += len(item.text)
            self.ended = item.event.is_terminal
            if self.ended:
                break
            if size >= CHUNK_CHARS:
                yield "".join(parts)
                parts, size = [], 0
        if parts:
            yield "".join(parts)


@dataclass
class _Line:
    """A queued job's place in line, as ``queued`` SSE events: sent first, then whenever the
    position drops (never a larger one: positions on the stream only go down), until the job
    starts or ends. The frames carry no ``id:``, so a reconnect's ``Last-Event-ID`` still
    names the last stored event (they are not stored: a reconnect gets the current place)."""

    store: JobStore
    job_id: str
    shown: int | None = None
    open: bool = True

    def frame(self) -> str | None:
        place = self.store.place_in_line(self.job_id)
        if place is None:
            try:
                self.open = self.store.get(self.job_id).state == QUEUED  # not yet sent: ask again
            except JobNotFound:
                self.open = False
            return None
        position, start = place
        if self.shown is not None and position >= self.shown:
            return None
        self.shown = position
        data = {"type": "queued", "ts": time.time(),
                "data": {"queue_position": position, "estimated_start": start}}
        return f"event: queued\ndata: {json.dumps(data)}\n\n"


def _follow(store: JobStore, job_id: str, state: _Progress, keepalive_s: int, feeds: FeedHub,
            line: _Line | None = None) -> Iterator[str]:
    feed = feeds.join(job_id, state.last, keepalive_s * 1000)
    wrote = time.monotonic()
    try:
        if line is not None and (frame := line.frame()):
            yield frame
        while True:
            items = feed.after(state.last)
            if items is None:  # fell behind the feed's buffer: the gap comes from Redis
                items = [Formatted(e, format_event(e)) for e in store.events(job_id, state.last)]
            yield from state.chunks(items)
            if state.ended:
                return
            if items:
                continue
            if feed.done:
                if feed.redis_lost:
                    _redis_lost(job_id, "ConnectionError")
                return
            waiting = line is not None and line.open
            feed.wait(state.last, LINE_POLL_S if waiting else keepalive_s)
            if feed.last <= state.last and not feed.done:
                frame = line.frame() if waiting and line is not None else None
                if frame is None and time.monotonic() - wrote < keepalive_s:
                    continue
                yield frame or ": keep-alive\n\n"
            wrote = time.monotonic()
    finally:
        feeds.leave(feed)


def _redis_lost(job_id: str, exc_type: str) -> None:
    """Redis went away mid-stream: the stream ends cleanly (no half-written chunk, no server
    error); the client reconnects after ``retry`` with Last-Event-ID and loses nothing."""
    log_event(logger, "sse_redis_lost", level=logging.WARNING, job_id=job_id, exc_type=exc_type)


def stream_over(store: JobStore, job_id: str, last_seq: int) -> bool:
    try:
        job = store.get(job_id)
    except JobNotFound:
        return True  # expired while we followed it
    return job.is_terminal and job.last_seq <= last_seq


def sse_response(events: Iterator[str], job_id: str) -> Response:
    response = Response(stream_with_context(events), mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    response.headers["X-Job-Id"] = job_id
    return response


class ClientGone(Exception):
    """The waiting request's client closed its connection (``web.disconnect``)."""


def wait_for_end(store: JobStore, job_id: str, timeout_s: float,
                 gone: Callable[[], bool] | None = None) -> JobRecord | None:
    """Block until the job's terminal event (returns the finished record) or ``timeout_s``
    (returns ``None``). XREAD answers at once when events are already stored. ``gone`` is
    asked once per second of waiting; when it says the client left, :class:`ClientGone`."""
    deadline, last = time.monotonic() + timeout_s, 0
    while (remaining := deadline - time.monotonic()) > 0:
        for event in store.wait_events(job_id, last, max(1, int(min(remaining, 1.0) * 1000))):
            last = event.seq
            if event.is_terminal:
                return store.get(job_id)
        if gone is not None and gone():
            raise ClientGone(job_id)
    return None
