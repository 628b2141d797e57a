"""The per-client limit on open SSE streams (``MINISERVE_MAX_STREAMS_PER_CLIENT``).

A stream costs the server a greenlet and a Redis connection for as long as the client keeps
it open, so one client (an API key, or an address) may hold at most that many at once; one
more is a 429 ``too_many_streams`` before any job is submitted for it. The count lives in
Redis (:func:`core.limits.open_stream`), so every web process sees the same one. The open
streams of a process have their leases renewed together (:class:`LeaseRenewer`, one
pipeline every third of a lease), and each gives its slot back when the server closes the
response (the client left, or the stream ended).
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import redis
from flask import Flask, Response, current_app, g, request

from core.limits import close_stream, open_stream, renew_streams
from core.logs import log_event
from web.context import ctx
from web.errors import ApiError

logger = logging.getLogger("miniserve.web.streams")
LEASE_EXTRA_S = 30  # a lease outlives three keep-alive ticks by this much
RENEWER_KEY = "miniserve.stream_leases"


@dataclass
class StreamSlot:
    """One counted open stream; :meth:`renewing` holds it while the stream runs (its lease
    renewed by the process's :class:`LeaseRenewer`), :meth:`close` frees it."""

    client: redis.Redis
    clients: tuple[str, ...]
    lease_s: float
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    renewer: LeaseRenewer | None = None
    closed: bool = False

    def renewing(self, chunks: Iterator[str]) -> Iterator[str]:
        """``chunks`` as they come; closing this closes ``chunks`` too (at once, not when it
        is collected: a route may act on its close)."""
        try:
            yield from chunks
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.renewer is not None:
                self.renewer.remove(self)
            _quietly(close_stream, "stream_close_failed", self.client, self.clients, self.token)


def _quietly(call, event: str, *args) -> None:
    """Redis being away must not break a stream: a lease then just runs out."""
    try:
        call(*args)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        log_event(logger, event, level=logging.WARNING, exc_type=type(exc).__name__)


class LeaseRenewer:
    """Renews the leases of every open stream of one web process in one pipeline every
    third of a lease. Measured with a renewal per stream (each stream's own pipeline, every
    15 s, 2,000 streams), py-spy put 18% of a web process's CPU there; now it is one
    pipeline per process per tick. A plain thread: a greenlet under the gevent worker."""

    def __init__(self, client: redis.Redis, lease_s: float) -> None:
        self.client, self.lease_s = client, lease_s
        self.slots: dict[str, StreamSlot] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, slot: StreamSlot) -> None:
        with self.lock:
            self.slots[slot.token] = slot
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, daemon=True, name="stream-leases")
                self.thread.start()

    def remove(self, slot: StreamSlot) -> None:
        with self.lock:
            self.slots.pop(slot.token, None)

    def renew_now(self) -> int:
        """Renews every open stream's lease; returns how many."""
        with self.lock:
            streams = [(slot.clients, slot.token) for slot in self.slots.values()]
        if streams:
            _quietly(renew_streams, "stream_renew_failed", self.client, streams, self.lease_s)
        return len(streams)

    def _run(self) -> None:
        while True:
            time.sleep(self.lease_s / 3)
            try:
                self.renew_now()
            except redis.RedisError as exc:  # any other refusal: the leases run out, the loop goes on
                log_event(logger, "stream_renew_failed", level=logging.WARNING, exc_type=type(exc).__name__)


def lease_renewer(app: Flask, client: redis.Redis, lease_s: float) -> LeaseRenewer:
    """The app's renewer (one per web process), made on first use."""
    renewer = app.extensions.get(RENEWER_KEY)
    if renewer is None:
        renewer = app.extensions[RENEWER_KEY] = LeaseRenewer(client, lease_s)
    return renewer


def stream_clients() -> tuple[str, ...]:
    """Who a stream counts against: the caller's address, and its API key when keys are on."""
    address = f"ip:{request.remote_addr or '-'}"
    owner = g.get("owner")
    return (f"key:{owner}", address) if owner else (address,)


def take_stream_slot() -> StreamSlot | None:
    """A slot for one more stream of this client, or a 429; ``None`` when unlimited."""
    settings = ctx().settings
    limit = settings.max_streams_per_client
    if limit <= 0:
        return None
    lease_s = 3 * settings.sse_keepalive_s + LEASE_EXTRA_S
    slot = StreamSlot(ctx().store.client, stream_clients(), lease_s)
    full = open_stream(slot.client, slot.clients, slot.token, limit, slot.lease_s)
    if full is not None:
        kind = "API key" if full.startswith("key:") else "address"
        raise ApiError(429, "too_many_streams", f"more than {limit} open streams for this {kind}; "
                       "close one first", retry_after=max(1, settings.sse_keepalive_s))
    slot.renewer = lease_renewer(current_app, slot.client, lease_s)
    slot.renewer.add(slot)
    return slot


def limited(response: Response, slot: StreamSlot | None) -> Response:
    """The streamed response, holding ``slot`` until the server closes it."""
    if slot is not None:
        response.response = slot.renewing(iter(response.response))  # type: ignore[assignment]
        response.call_on_close(slot.close)
    return response


@contextmanager
def freed_on_error(slot: StreamSlot | None) -> Iterator[None]:
    """Frees ``slot`` when what comes before the stream fails (a submission refused with a 4xx
    or 503), so a refused request never holds a stream's place."""
    try:
        yield
    except BaseException:
        if slot is not None:
            slot.close()
        raise
