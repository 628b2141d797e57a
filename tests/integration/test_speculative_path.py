"""Speculative decoding through the real queue: redis-server + a Celery worker + the tiny
model. The per-request flag travels in the stored request; the result's usage counts the
drafts; greedy text is the same as with speculation off; the worker's heartbeat carries the
acceptance counters the metrics read."""
from __future__ import annotations

import pytest

from core.events import SUCCEEDED
from core.workers import list_workers
from tests.integration.conftest import gen_request, submit, wait_terminal

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(shared_stack):
    """A Celery client on the shared stack (the ``celery_client`` fixture would start, and
    flush, a stack of its own)."""
    from celery import Celery

    app = Celery("miniserve-test-client", broker=shared_stack.redis_url)
    yield app
    app.close()


COPY = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over"


@pytest.mark.parametrize("method", ["custom_cache", "paged"])
def test_flag_on_and_off_through_the_queue(shared_store, client, shared_worker, method):
    results = {}
    for flag in (False, True):
        request = {**gen_request(COPY, max_new_tokens=40), "method": method, "speculative": flag,
                   "return_token_ids": True}
        record = wait_terminal(shared_store, submit(shared_store, client, request).id)
        assert record.state == SUCCEEDED, record.error
        results[flag] = record.result
    assert results[True]["token_ids"] == results[False]["token_ids"]
    assert results[True]["text"] == results[False]["text"]
    assert results[False]["usage"]["draft_tokens"] == 0
    assert results[True]["usage"]["draft_tokens"] > 0
    assert 0 <= results[True]["usage"]["accepted_draft_tokens"] <= results[True]["usage"]["draft_tokens"]


def test_heartbeat_counts_drafts(shared_store, shared_worker):
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stats = [w.get("info", {}).get("cache_stats") or {} for w in list_workers(shared_store.client, 60)]
        drafted = sum(int(part.get("draft_tokens", 0)) for s in stats for part in s.values()
                      if isinstance(part, dict))
        if drafted > 0:
            return
        time.sleep(0.5)
    pytest.fail("no worker heartbeat reported speculative draft counts")
