"""The per-client limit on open SSE streams (``MINISERVE_MAX_STREAMS_PER_CLIENT``).

A stream costs the server a greenlet and a Redis connection for as long as the client keeps
it open, so one client (an API key, or an address) may hold at most that many at once; one
more is a 429 ``too_many_streams`` before any job is submitted for it. The count lives in
Redis (:func:`core.limits.open_stream`), so every web process sees the same one. A stream
renews its lease as it runs and gives its slot back when the server closes the response
(the client left, or the stream ended).
"""
from __future__ import annotations

import logging
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import redis
from flask import Response, g, request

from core.limits import close_stream, open_stream, renew_stream
from core.logs import log_event
from web.context import ctx
from web.errors import ApiError

logger = logging.getLogger("miniserve.web.streams")
LEASE_EXTRA_S = 30  # a lease outlives three keep-alive ticks by this much


@dataclass
class StreamSlot:
    """One counted open stream; :meth:`renewing` keeps its lease, :meth:`close` frees it."""

    client: redis.Redis
    clients: tuple[str, ...]
    lease_s: float
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    renewed_at: float = field(default_factory=time.monotonic)
    closed: bool = False

    def renewing(self, chunks: Iterator[str]) -> Iterator[str]:
        """``chunks`` as they come, renewing the lease now and then; closing this closes
        ``chunks`` too (at once, not when it is collected: a route may act on its close)."""
        try:
            for chunk in chunks:
                yield chunk
                if time.monotonic() - self.renewed_at > self.lease_s / 3:
                    self._quietly(renew_stream, "stream_renew_failed", self.lease_s)
                    self.renewed_at = time.monotonic()
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._quietly(close_stream, "stream_close_failed")

    def _quietly(self, call, event: str, *args) -> None:
        """Redis being away must not break the stream: the lease then just runs out."""
        try:
            call(self.client, self.clients, self.token, *args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log_event(logger, event, level=logging.WARNING, exc_type=type(exc).__name__)


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
    slot = StreamSlot(ctx().store.client, stream_clients(), 3 * settings.sse_keepalive_s + LEASE_EXTRA_S)
    full = open_stream(slot.client, slot.clients, slot.token, limit, slot.lease_s)
    if full is not None:
        kind = "API key" if full.startswith("key:") else "address"
        raise ApiError(429, "too_many_streams", f"more than {limit} open streams for this {kind}; "
                       "close one first", retry_after=max(1, settings.sse_keepalive_s))
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
