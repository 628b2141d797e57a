"""Reliability tests run on the real stack; they reuse the integration fixtures
(``redis_proc``, ``stack``, ``store``, ``worker``, ``celery_client``, ``tiny_model``, ...)
and add a Redis of their own that can be stopped and restarted on the same port and dir."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from core.jobs import JobStore
from tests.harness.stack import Process, Stack, free_port, start_redis
from tests.integration.conftest import (  # noqa: F401 - fixtures, re-exported for this folder
    WORKER_ENV, celery_client, redis_proc, shared_stack, shared_store, shared_worker, stack, store,
    stack_store, tiny_model, worker,
)


@dataclass
class RestartableRedis:
    """A private redis-server with the append-only file on: ``stop`` (SIGTERM, as a service
    manager restarts it) and ``start`` again on the same port and data dir."""

    data_dir: Path
    port: int
    appendonly: bool = True
    proc: Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc, _ = start_redis(self.data_dir, port=self.port, appendonly=self.appendonly)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)


@pytest.fixture(scope="module")
def restartable_redis(tmp_path_factory):
    server = RestartableRedis(tmp_path_factory.mktemp("redis-data"), free_port())
    server.start()
    yield server
    if server.proc is not None:
        server.proc.kill()


@pytest.fixture(scope="module")
def own_stack(restartable_redis, tiny_model) -> Stack:
    return Stack(redis_url=restartable_redis.url,
                 env_overrides={**WORKER_ENV, "MINISERVE_MODEL": str(tiny_model), "MINISERVE_WEB_WORKERS": "1"})


@pytest.fixture(scope="module")
def own_store(own_stack) -> JobStore:
    return stack_store(own_stack)
