"""One worker process serving many jobs at once (threads pool feeding the paged scheduler)."""
from __future__ import annotations

import concurrent.futures as futures

import pytest

from core.events import SUCCEEDED
from core.workers import list_workers
from tests.harness.stack import wait_until
from tests.integration.conftest import gen_request, submit, wait_for_worker, wait_terminal

pytestmark = pytest.mark.integration


def test_eight_concurrent_jobs_on_one_worker_process(stack, store, celery_client):
    """Eight paged jobs in one threads-pool worker start in one step and run as one batch. The
    worker's loop is held until all eight are queued for it (MINISERVE_TEST_LOOP_HOLD, a gate),
    so this holds however busy the machine is: without the hold a short job could end before
    the last one's thread reached the loop."""
    proc = stack.start_worker(pool="threads", concurrency=8, MINISERVE_MAX_BATCH="8", MINISERVE_TEST_LOOP_HOLD="8")
    try:
        wait_for_worker(store)
        prompts = [f"Story number {i}: once upon a time" + " and then" * i for i in range(8)]
        jobs = [submit(store, celery_client, {**gen_request(p, max_new_tokens=24 + 4 * i), "method": "paged"})
                for i, p in enumerate(prompts)]
        with futures.ThreadPoolExecutor(8) as pool:
            records = list(pool.map(lambda j: wait_terminal(store, j.id, 120), jobs))
        assert [r.state for r in records] == [SUCCEEDED] * 8, [r.error for r in records]
        assert len({r.worker for r in records}) == 1  # one process served them all
        for record in records:
            streamed = "".join(e.data["text"] for e in store.events(record.id) if e.type == "token")
            assert streamed == record.result["text"]
            assert record.result["method"] == "paged"
        wait_until(lambda: _paged_stats(store).get("finished", 0) >= 8, 30, what="a heartbeat after the jobs")
        assert _paged_stats(store)["max_batch_size"] == 8  # all eight in one batch
        info = list_workers(store.client, max_age_s=15)[0]["info"]
        assert info["pool"] == "thread" and info["concurrency"] == 8
    finally:
        proc.kill()  # teardown: no graceful stop is under test here


def _paged_stats(store) -> dict:
    workers = list_workers(store.client, max_age_s=15)
    return workers[0]["info"]["cache_stats"].get("paged", {}) if workers else {}


def test_non_batched_jobs_share_the_engine_loop_with_batched_ones(stack, store, celery_client):
    """Paged and non-batched jobs at once in one threads-pool worker: every method runs on the
    one engine loop (no exclusive lock), each job ends once with its streamed text, and the
    heartbeat carries the loop's published snapshot."""
    proc = stack.start_worker(pool="threads", concurrency=8, MINISERVE_MAX_BATCH="8")
    try:
        wait_for_worker(store)
        methods = ["paged", "custom_cache", "paged", "official", "no_cache", "prefix_cache", "paged"]
        jobs = [submit(store, celery_client, {**gen_request(f"Question {i}: tell me a story",
                                                            max_new_tokens=16), "method": m})
                for i, m in enumerate(methods)]
        with futures.ThreadPoolExecutor(8) as pool:
            records = list(pool.map(lambda j: wait_terminal(store, j.id, 120), jobs))
        assert [r.state for r in records] == [SUCCEEDED] * len(methods), [r.error for r in records]
        for record, method in zip(records, methods):
            events = store.events(record.id)
            assert sum(e.is_terminal for e in events) == 1
            assert "".join(e.data["text"] for e in events if e.type == "token") == record.result["text"]
            assert record.result["method"] == method
            waits = [e.data["waiting"] for e in events if e.type == "waiting"]
            assert waits in ([], [True, False])
        wait_until(lambda: (list_workers(store.client, max_age_s=15)[0]["info"]["cache_stats"]
                            .get("paged", {}).get("finished", 0)) >= 3, 20, what="a fresh heartbeat")
        stats = list_workers(store.client, max_age_s=15)[0]["info"]["cache_stats"]
        assert stats["loop"]["alive"] and stats["paged"]["running"] == 0
    finally:
        proc.kill()  # teardown: no graceful stop is under test here
