"""The worker side of the full path on real parts: redis-server + Celery worker + tiny model.

Tests that kill, stop or configure their worker; those that leave it as they found it share
one in test_worker_jobs.py."""
from __future__ import annotations

import os
import signal

import pytest

from core.events import FAILED, RUNNING, SUCCEEDED, TIMEOUT
from tests.harness.stack import wait_until
from tests.harness.step_gate import StepGate
from tests.integration.conftest import (
    _started_workers, count_tokens_emitted, events_text, gen_request, sleep_until_tokens, submit, wait_for_worker,
    wait_terminal,
)

pytestmark = pytest.mark.integration
LONG = 4000  # tokens: never reached, the step gate holds the job until its process is killed
# The dead-worker test runs its job to the end twice (the second time uninterrupted): the step
# gate holds the first attempt after three steps, so the length only has to outlast those.
RESUMED_LONG = 96


def _pool_child_pid(store, job_id) -> int:
    """The pid of the process running the job (worker names end in ':<pid>')."""
    return int(store.get(job_id).worker.rsplit(":", 1)[1])


def test_sigkill_of_pool_child_reruns_job(store, celery_client, stack, worker):
    with StepGate(store.client).closed(steps=3):  # running when its process is killed
        job = submit(store, celery_client, gen_request(max_new_tokens=64))
        sleep_until_tokens(store, job.id, 1)  # the first chunk goes out at once
        assert store.get(job.id).state == RUNNING
        os.kill(_pool_child_pid(store, job.id), signal.SIGKILL)
    record = wait_terminal(store, job.id, 90)
    assert record.state == SUCCEEDED and record.attempt == 2
    restarts = [e for e in store.events(job.id) if e.type == "state" and e.data.get("restart")]
    assert len(restarts) == 1 and restarts[0].attempt == 2
    assert events_text(store, job.id) == record.result["text"]  # attempt 2 went on from attempt 1's text


def test_a_dead_workers_stream_goes_on_where_it_stopped(stack, store, celery_client):
    """SIGKILL a whole worker mid-stream (a threads worker: the job runs in its main process).
    Its heartbeats stop, so another worker's reaper re-queues the job long before the lease
    (ten minutes here) would; the next attempt continues from the streamed tokens. The client's
    text (every token event in order) is the stored result, nothing repeated or lost, and a
    seeded answer is the one an uninterrupted run gives. The dying worker is frozen (SIGSTOP)
    before the kill, so what it streamed is fixed while the test reads it.

    Both workers start (and load) together, and whichever took the job is the one killed: the
    survivor's reaper has been in touch with Redis for its grace period by the time the dead
    one's heartbeat is old enough, instead of a second start after the kill."""
    env = {"MINISERVE_LEASE_S": "600", "MINISERVE_WORKER_DEAD_S": "10"}
    request = {"messages": [{"role": "user", "content": "Tell me a long story."}], "method": "paged",
               "return_token_ids": True,
               "sampling": {"max_new_tokens": RESUMED_LONG, "temperature": 0.8, "seed": 11, "ignore_eos": True}}
    workers = _started_workers(stack, store, *({"name": name, "pool": "threads", "concurrency": 2, **env}
                                                for name in ("w1", "w2")))
    with StepGate(store.client).closed(steps=3):  # the first attempt holds after three steps
        job = submit(store, celery_client, request)
        sleep_until_tokens(store, job.id, 1)  # the first chunk goes out at once
        holder = store.get(job.id).worker
        first, second = workers if holder.startswith("w1@") else workers[::-1]
        os.kill(first.popen.pid, signal.SIGSTOP)
        assert store.get(job.id).state == RUNNING
        streamed = [e for e in store.events(job.id) if e.type == "token"]
    first.kill()
    try:
        record = wait_terminal(store, job.id, 120)
        assert record.state == SUCCEEDED and record.attempt == 2, second.log()[-3000:]
        events = store.events(job.id)
        assert [e.data.get("reason") for e in events if e.type == "state"].count("worker_dead") == 1
        tokens = [e for e in events if e.type == "token"]
        assert tokens[:len(streamed)] == streamed and {e.attempt for e in tokens[len(streamed):]} == {2}
        assert "".join(e.data["text"] for e in tokens) == record.result["text"]
        assert [i for e in tokens for i in e.data["ids"]] == record.result["token_ids"]
        assert record.result["usage"]["completion_tokens"] == len(record.result["token_ids"]) == RESUMED_LONG
        again = wait_terminal(store, submit(store, celery_client, request).id, 120)
        assert again.result["token_ids"] == record.result["token_ids"]  # seeded per position
    finally:
        second.kill()


def test_graceful_stop_finishes_running_job(store, celery_client, worker):
    with StepGate(store.client).closed(steps=3):  # running when the stop comes, until the stop is under way
        job = submit(store, celery_client, gen_request(max_new_tokens=64))
        sleep_until_tokens(store, job.id, 1)  # the first chunk goes out at once
        worker.popen.send_signal(signal.SIGTERM)  # warm shutdown: waits for the running task
        wait_until(lambda: "Warm shutdown" in worker.log(), 30, what="the warm shutdown begun")
        assert store.get(job.id).state == RUNNING
    worker.popen.wait(60)
    record = store.get(job.id)
    assert record.state == SUCCEEDED and record.attempt == 1


def test_soft_time_limit_ends_job_timeout(stack, store, celery_client):
    proc = stack.start_worker(MINISERVE_SOFT_TIME_LIMIT_S="2", MINISERVE_HARD_TIME_LIMIT_S="30")
    try:
        wait_for_worker(store)
        job = submit(store, celery_client, gen_request(max_new_tokens=100_000))
        record = wait_terminal(store, job.id, 60)
        assert record.state == TIMEOUT
        assert store.events(job.id)[-1].type == "timeout"
        assert record.error["partial"]["usage"]["completion_tokens"] > 0
    finally:
        proc.kill()  # teardown: no graceful stop is under test here


def test_job_that_keeps_killing_its_worker_is_not_retried_forever(store, celery_client, worker):
    gate = StepGate(store.client)
    with gate.closed():  # each attempt takes the steps allowed it, then holds until its process is killed
        job = submit(store, celery_client, gen_request(max_new_tokens=LONG))
        for attempt in (1, 2, 3):  # the "poison" job: every attempt dies with its process
            wait_until_attempt(store, job.id, attempt)
            emitted = count_tokens_emitted(store, job.id)  # counted before the steps: they may all run at once
            gate.allow(3)
            sleep_until_tokens(store, job.id, emitted + 1)
            os.kill(_pool_child_pid(store, job.id), signal.SIGKILL)
        record = wait_terminal(store, job.id, 90)
    assert record.state == FAILED and record.error["code"] == "worker_lost"
    assert [e.type for e in store.events(job.id)].count("error") == 1


def wait_until_attempt(store, job_id, attempt):
    wait_until(lambda: store.get(job_id).attempt == attempt and store.get(job_id).state == RUNNING, 90,
               what=f"attempt {attempt}")
    wait_for_worker(store)
