"""Celery's own task state (what Flower and ``celery result`` show) tells how each job ended.

One real worker with a short soft time limit runs a job that succeeds, one that fails, one
cancelled while running, one cancelled while queued and one that times out; the result
backend is read with ``AsyncResult`` as the ``celery result`` command does.
"""
from __future__ import annotations


import pytest
from celery import Celery

from tests.harness.stack import wait_until
from core.events import CANCELLED, FAILED, SUCCEEDED, TIMEOUT
from tests.integration.conftest import (
    gen_request, sleep_until_tokens, submit, wait_for_worker, wait_terminal,
)

pytestmark = pytest.mark.integration
SOFT_LIMIT_S = 3


@pytest.fixture
def results(stack):
    """A client with the result backend, as ``celery -A worker result`` reads it."""
    app = Celery("celery-state-test", broker=stack.redis_url, backend=stack.redis_url)
    yield app
    app.close()


@pytest.fixture
def timed_worker(stack, store):
    proc = stack.start_worker(MINISERVE_SOFT_TIME_LIMIT_S=str(SOFT_LIMIT_S), MINISERVE_HARD_TIME_LIMIT_S="60")
    try:
        wait_for_worker(store)
    except TimeoutError:
        proc.kill()
        raise AssertionError("worker did not come up:\n" + proc.log()[-4000:])
    yield proc
    proc.kill()  # teardown: no graceful stop is under test here


def celery_state(results: Celery, job_id: str, expected: str, timeout_s: float = 20):
    """Wait for the backend to hold ``expected`` (it is written just after the job ends)."""
    result = results.AsyncResult(job_id)
    try:
        wait_until(lambda: result.state == expected, timeout_s, what=f"Celery state {expected}")
    except TimeoutError:
        raise AssertionError(f"job {job_id}: Celery state {result.state}, wanted {expected}") from None
    return result


def test_each_end_has_its_celery_state(store, celery_client, results, timed_worker):
    done = submit(store, celery_client, gen_request(max_new_tokens=8))
    assert wait_terminal(store, done.id).state == SUCCEEDED
    ok = celery_state(results, done.id, "SUCCESS")
    assert ok.result["state"] == SUCCEEDED and ok.result["usage"]["completion_tokens"] > 0
    assert "text" not in ok.result  # the answer stays in the job store only

    failed = submit(store, celery_client, {"messages": [], "sampling": {"max_new_tokens": 4}})
    assert wait_terminal(store, failed.id).state == FAILED
    err = celery_state(results, failed.id, "FAILURE")
    assert type(err.result).__name__ == "JobError" and str(err.result) == "bad_request"

    running = submit(store, celery_client, gen_request(max_new_tokens=100_000))
    sleep_until_tokens(store, running.id, 2)
    store.request_cancel(running.id)
    assert wait_terminal(store, running.id).state == CANCELLED
    celery_state(results, running.id, "REVOKED")

    timed = submit(store, celery_client, gen_request(max_new_tokens=100_000))
    queued = submit(store, celery_client, gen_request(max_new_tokens=8))  # waits behind ``timed``
    assert store.request_cancel(queued.id).state == CANCELLED
    assert wait_terminal(store, timed.id, 60).state == TIMEOUT
    late = celery_state(results, timed.id, "FAILURE")
    assert type(late.result).__name__ == "JobTimedOut" and str(late.result) == "timeout"
    celery_state(results, queued.id, "REVOKED")  # its message was taken, and skipped


def test_a_failed_job_is_not_run_again(store, celery_client, results, timed_worker):
    failed = submit(store, celery_client, {"messages": [], "sampling": {"max_new_tokens": 4}})
    celery_state(results, failed.id, "FAILURE")
    # One job at a time, in order: an immediate retry or a re-delivery of the failed job's message would be
    # taken before a job sent now ends.
    follower = submit(store, celery_client, gen_request(max_new_tokens=4))
    assert wait_terminal(store, follower.id).state == SUCCEEDED
    record = store.get(failed.id)
    assert record.state == FAILED and record.attempt == 1 and record.dispatch == 0
    assert [e.type for e in store.events(failed.id)].count("error") == 1
    assert "Retry in" not in timed_worker.log()
