"""One real stack for every test of the user's surface: redis-server, a Celery worker with
a tiny random model, and ``python -m web`` (gunicorn): the test process's served stack
(:mod:`tests.harness.served`), kept from its first surface test to the process's end.

The names here are the ones the surface tests were written against."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def surface_stack(served_surface):
    return served_surface.stack


@pytest.fixture(scope="package")
def surface_store(served_surface):
    return served_surface.store


@pytest.fixture(scope="package")
def surface_worker(served_surface):
    return served_surface.worker


@pytest.fixture(scope="package")
def base_url(served_surface) -> str:
    return served_surface.base_url


@pytest.fixture(scope="package")
def tiny_model(served_model_dir):
    """The model the served stack runs (a second stack here, blip_stack, runs it too)."""
    return served_model_dir


@pytest.fixture(scope="package")
def served_model(served_model_dir) -> str:
    """The id the cluster serves the tiny model under (its folder's name, core/model_source.py)."""
    return served_model_dir.name
