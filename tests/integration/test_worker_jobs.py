"""Jobs on one worker of the full path (redis-server + Celery worker + tiny model): a job's
stream and result, a running and a queued job cancelled. None of these harms its worker, so
they run on the test process's shared stack (tests/harness/served.py, with
tests/integration/shared: a worker's start is seconds); tests that kill, stop or configure
theirs are in test_worker_path.py."""
from __future__ import annotations

import pytest

from core.events import CANCELLED, RUNNING, SUCCEEDED
from tests.harness.step_gate import StepGate
from tests.integration.conftest import events_text, gen_request, sleep_until_tokens, submit, wait_terminal

pytestmark = pytest.mark.integration
LONG = 4000  # tokens: never reached, the job is cancelled while the step gate holds it


@pytest.fixture(scope="module")
def shared_client(served_shared):
    """A Celery client on the shared stack (``celery_client`` would flush a stack of its own)."""
    from celery import Celery

    app = Celery("miniserve-test-client", broker=served_shared.stack.redis_url)
    yield app
    app.close()


@pytest.fixture
def store(served_shared):
    """The shared store, with the shared (prefork, one process: one job at a time) worker up."""
    return served_shared.store


@pytest.fixture
def gate(store):
    return StepGate.on(store)


def test_job_succeeds_and_stream_equals_result(store, shared_client):
    job = submit(store, shared_client, {**gen_request(max_new_tokens=24), "return_token_ids": True})
    record = wait_terminal(store, job.id)
    assert record.state == SUCCEEDED, record.error
    events = store.events(job.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].type == "state" and events[0].data["state"] == RUNNING
    assert [e.type for e in events].count("done") == 1 and events[-1].type == "done"
    assert events_text(store, job.id) == record.result["text"]
    assert record.result["usage"]["completion_tokens"] == len(record.result["token_ids"]) > 0
    assert record.result["finish_reason"] in ("stop", "length")


def test_cancel_running_job_stops_within_a_few_tokens(store, shared_client, gate):
    with gate.closed(steps=3):  # the job takes 3 steps, then holds, running, until the gate opens
        job = submit(store, shared_client, gen_request(max_new_tokens=LONG))
        sleep_until_tokens(store, job.id, 1)  # the first chunk goes out at once
        assert store.get(job.id).state == RUNNING
        store.request_cancel(job.id)
        emitted_at_cancel = sum(1 for e in store.events(job.id) if e.type == "token")
    record = wait_terminal(store, job.id, 30)
    assert record.state == CANCELLED
    emitted = sum(1 for e in store.events(job.id) if e.type == "token")
    assert emitted - emitted_at_cancel < 50  # cancel flag polled every 50 ms between tokens
    assert store.events(job.id)[-1].type == "cancelled"


def test_cancel_queued_job_never_runs(store, shared_client, gate):
    with gate.closed(steps=3):  # the blocker runs until the test has sent and cancelled the others
        blocker = submit(store, shared_client, gen_request(max_new_tokens=LONG))
        sleep_until_tokens(store, blocker.id, 1)
        queued = submit(store, shared_client, gen_request(max_new_tokens=8))
        assert store.request_cancel(queued.id).state == CANCELLED
        follower = submit(store, shared_client, gen_request(max_new_tokens=4))  # sent after it
        store.request_cancel(blocker.id)
    wait_terminal(store, blocker.id)
    # One job at a time, in order: once the follower ends, the cancelled job's message was taken.
    assert wait_terminal(store, follower.id).state == SUCCEEDED
    assert [e.type for e in store.events(queued.id)] == ["cancelled"]
    assert store.get(queued.id).attempt == 0
