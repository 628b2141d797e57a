"""Real stacks kept for the whole test process: each a redis-server of its own, a Celery
worker on the tiny model and ``python -m web``, started by the first test that asks.

Why: the user's-surface tests (tests/surface) and the integration tests that leave their
processes as they found them (tests/integration/shared) each started such a stack per package
or module, 10-25 s apiece on a busy 2-core machine, and ``--dist loadfile`` interleaves
packages, so one process started the same stack several times. Registered in the root
conftest (a session fixture imported into two conftests would be two fixtures, two stacks).

Two stacks, not one: tests/surface/test_monitor_page.py asserts the worker's prefix-cache
counters after its own two jobs, which the shared modules' benchmark jobs would move. Each
has its own Redis, which no other fixture flushes: a module sees the jobs of the modules of
its package before it (as it did within a package-scoped stack). Settings are the integration
harness's (WORKER_ENV); the worker is told its web's address (MINISERVE_WEB_URL) for the
Batch API's Celery task (tests/integration/shared/test_batch_celery.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Served:
    stack: object  # tests.harness.stack.Stack (imported lazily: make test-fast never starts this)
    store: object  # core.jobs.JobStore on the stack's Redis
    worker: object  # tests.harness.stack.Process
    base_url: str


@pytest.fixture(scope="session")
def served_model_dir(tmp_path_factory) -> Path:
    """The tiny model the served stack runs (the integration harness's ``tiny_model`` shape)."""
    from tests.tiny_model import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("served-model"), hidden_size=64, num_layers=2)


def serve(tmp_path_factory, model_dir: Path, **env: str):
    """Start a stack on a redis-server of its own, yield it as :class:`Served`, then stop it.
    The worker and the web start together (the web boots while the worker loads)."""
    from tests.harness.stack import Stack, free_port, start_redis
    from tests.integration.conftest import WORKER_ENV, _loaded, stack_store, started_web

    redis_proc, url = start_redis(tmp_path_factory.mktemp("served-redis"))
    stack = Stack(redis_url=url, env_overrides={**WORKER_ENV, "MINISERVE_MODEL": str(model_dir), **env})
    store = stack_store(stack)
    port = free_port()
    worker = stack.start_worker(MINISERVE_WEB_URL=f"http://127.0.0.1:{port}")
    try:
        web, base_url = started_web(stack, port)
        _loaded(store, [worker])
    except AssertionError:
        worker.kill()
        redis_proc.kill()
        raise
    yield Served(stack, store, worker, base_url)
    web.kill()  # teardown: no graceful stop is under test here
    worker.kill()
    redis_proc.kill()


@pytest.fixture(scope="session")
def served_surface(tmp_path_factory, served_model_dir):
    """tests/surface's stack."""
    yield from serve(tmp_path_factory, served_model_dir)


@pytest.fixture(scope="session")
def served_shared(tmp_path_factory, served_model_dir):
    """tests/integration/shared's stack, on the integration harness's settings as they are."""
    yield from serve(tmp_path_factory, served_model_dir)
