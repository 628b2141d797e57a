"""One real stack for every test of the user's surface: redis-server, a Celery worker with
a tiny random model, and ``python -m web`` (gunicorn), started once for the package.

Reuses the integration harness (:mod:`tests.integration.conftest`)."""
from __future__ import annotations

import pytest
import redis
import requests

from bench.stack import wait_until
from core.jobs import JobStore
from tests.integration.conftest import _clean_stack, _started_worker, redis_proc, tiny_model  # noqa: F401


@pytest.fixture(scope="package")
def surface_stack(redis_proc, tiny_model):  # noqa: F811
    return _clean_stack(redis_proc, tiny_model)


@pytest.fixture(scope="package")
def surface_store(surface_stack) -> JobStore:
    return JobStore(redis.Redis.from_url(surface_stack.redis_url, decode_responses=True), ttl_s=3600)


@pytest.fixture(scope="package")
def surface_worker(surface_stack, surface_store):
    proc = _started_worker(surface_stack, surface_store)
    yield proc
    proc.stop()


@pytest.fixture(scope="package")
def base_url(surface_stack, surface_worker) -> str:
    proc, url = surface_stack.start_web()

    def up() -> bool:
        try:
            return requests.get(f"{url}/healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_until(up, 30, what="web server")
    except TimeoutError:
        proc.kill()
        raise AssertionError("web did not come up:\n" + proc.log()[-4000:])
    yield url
    proc.stop()
