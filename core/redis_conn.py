"""The one place that turns ``MINISERVE_REDIS_URL`` into Redis connections.

Two forms are accepted:

* a plain URL, ``redis://host:6379/0`` (or ``rediss://``, ``unix://``): one Redis server;
* a Sentinel list, ``sentinel://h1:26379;sentinel://h2:26379[/db]``, with the master's name
  in ``MINISERVE_REDIS_SENTINEL_MASTER``: the sentinels say which server is the master now,
  and every client asks them again after a connection error, so a promoted replica is found
  without a restart.

The job store and pub/sub use :func:`redis_client` (redis-py ``Sentinel.master_for``); the
Celery broker and result backend use :func:`celery_redis_options` (kombu's ``sentinel``
transport reads the same URL, plus ``master_name`` in its transport options). Web, worker
and benchmarks all go through here, so they always agree on where Redis is.
"""
from __future__ import annotations

from typing import Any

import redis
from redis.sentinel import Sentinel, SentinelManagedConnection

from core.redis_url import SENTINEL_SCHEME, RedisTarget, RedisUrlError, parse_redis_url  # noqa: F401 - one import for callers

SENTINEL_SOCKET_TIMEOUT_S = 1.0  # asking a sentinel is quick; a dead one must not hold a request


class MasterFollowingConnection(SentinelManagedConnection):
    """Asks the sentinels for the master on every socket connect attempt.

    redis-py 8's ``send_command`` reconnects a dropped connection through
    ``connect_check_health``, which retries the socket connect on the address the
    connection had before: after a failover every retry went to the dead master (seen in
    tests/scale/test_sentinel_failover.py, ~20 s of refused connects, then the job failed).
    Resolving here, per attempt, makes each retry follow the promoted replica."""

    def _connect(self):
        if self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        return super()._connect()


def target_of(settings: Any) -> RedisTarget:
    return parse_redis_url(settings.redis_url, settings.redis_sentinel_master)


def redis_client(settings: Any, **options: Any) -> redis.Redis:
    """A pooled client on the current master. ``options`` are redis-py connection options
    (``decode_responses``, ``socket_timeout``, ``retry``...), applied in both forms."""
    return client_for(target_of(settings), **options)


def client_for(target: RedisTarget, **options: Any) -> redis.Redis:
    if not target.is_sentinel:
        return redis.Redis.from_url(target.url, **options)
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs={"socket_timeout": SENTINEL_SOCKET_TIMEOUT_S,
                                         "socket_connect_timeout": SENTINEL_SOCKET_TIMEOUT_S})
    if target.password:
        options.setdefault("password", target.password)
    options.setdefault("connection_class", MasterFollowingConnection)
    return sentinel.master_for(target.master_name, db=target.db, **options)


def celery_redis_options(settings: Any, transport_options: dict[str, Any] | None = None,
                         backend: bool = True) -> dict[str, Any]:
    """Celery settings for the broker (and result backend) on this Redis: the URL as given,
    and for Sentinel the master's name in both transport-option dicts."""
    target = target_of(settings)
    broker_options = dict(transport_options or {})
    conf: dict[str, Any] = {"broker_url": target.url}
    if target.is_sentinel:
        broker_options["master_name"] = target.master_name
        broker_options.setdefault("sentinel_kwargs", {"socket_timeout": SENTINEL_SOCKET_TIMEOUT_S})
    conf["broker_transport_options"] = broker_options
    if backend:
        conf["result_backend"] = target.url
        if target.is_sentinel:
            conf["result_backend_transport_options"] = {"master_name": target.master_name}
    return conf
