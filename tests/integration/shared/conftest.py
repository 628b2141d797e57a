"""Tests here share one worker and one web server per module (they don't harm the processes)."""
import pytest


@pytest.fixture(scope="module")
def worker(shared_worker):
    return shared_worker


@pytest.fixture
def store(shared_store):
    return shared_store
