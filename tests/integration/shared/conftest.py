"""Tests here run on the test process's shared stack (:mod:`tests.harness.served`: its own
redis-server, one worker, one web), kept for the whole process: they don't harm the processes,
and they assert on their own jobs, not on an empty store."""
import pytest


@pytest.fixture
def worker(served_shared):
    return served_shared.worker


@pytest.fixture
def store(served_shared):
    return served_shared.store


@pytest.fixture
def web(served_shared) -> str:
    return served_shared.base_url
