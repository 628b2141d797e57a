"""One real stack for every test of the user's surface: redis-server, a Celery worker with
a tiny random model, and ``python -m web`` (gunicorn), started once for the package.

Reuses the integration harness (:mod:`tests.integration.conftest`)."""
from __future__ import annotations

import pytest

from core.jobs import JobStore
from tests.integration.conftest import (  # noqa: F401  (fixtures)
    _clean_stack, _started_worker, redis_proc, stack_store, started_web, tiny_model,
)


@pytest.fixture(scope="package")
def surface_stack(redis_proc, tiny_model):  # noqa: F811
    stack = _clean_stack(redis_proc, tiny_model)
    # the pool view's job must outlast the page's sight of a heartbeat (up to 2 s): 2,048
    # tokens, the default cap, took less than that on a fast CPU
    stack.env_overrides["MINISERVE_MAX_NEW_TOKENS_CAP"] = "4000"
    return stack


@pytest.fixture(scope="package")
def surface_store(surface_stack) -> JobStore:
    return stack_store(surface_stack)


@pytest.fixture(scope="package")
def surface_worker(surface_stack, surface_store):
    proc = _started_worker(surface_stack, surface_store)
    yield proc
    proc.kill()  # teardown: no graceful stop is under test here


@pytest.fixture(scope="package")
def base_url(surface_stack, surface_worker) -> str:
    proc, url = started_web(surface_stack)
    yield url
    proc.kill()  # teardown: no graceful stop is under test here


@pytest.fixture(scope="package")
def served_model(tiny_model) -> str:  # noqa: F811
    """The id the cluster serves the tiny model under (its folder's name, core/model_source.py)."""
    return tiny_model.name
