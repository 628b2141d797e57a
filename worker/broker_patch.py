"""A guard around a kombu 5.7 bug that kills a worker when Redis goes away mid-task.

When the broker connection is lost while a late-acked task runs, Celery collects the old
connection (its transport forgets its client) and then closes it again; closing the
channel tries to restore the unacked message through that client, and kombu's Redis
channel builds its connection parameters from ``transport.client`` -- ``None`` by then.
The ``AttributeError`` is not a connection error, so it escapes Celery's clean-up and the
worker stops ("Unrecoverable error"); the running task's ack at its end fails the same way.

The guard turns that case into what it is, a lost connection (``redis.ConnectionError``),
which kombu and Celery already handle: the restore is skipped and the ack is logged as
failed. Nothing is lost: the message stays in kombu's unacked set in Redis and comes back
after the visibility timeout, when ``START_ATTEMPT`` sees the job ended and skips it.
"""
from __future__ import annotations

import functools

import redis
from kombu.transport import redis as kombu_redis

_PATCHED = "_miniserve_closed_transport_guard"


def install() -> None:
    """Idempotent: wrap ``Channel._connparams`` once per process."""
    original = kombu_redis.Channel._connparams
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def _connparams(self, *args, **kwargs):
        if self.connection is None or self.connection.client is None:
            raise redis.ConnectionError("the broker connection was closed after a connection loss")
        return original(self, *args, **kwargs)

    setattr(_connparams, _PATCHED, True)
    kombu_redis.Channel._connparams = _connparams
