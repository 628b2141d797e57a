"""Deadlines on the real stack (redis-server, Celery worker, tiny model): a job still queued at
its deadline never reaches the engine, whether a worker takes its message after the deadline
or the reaper's sweep ends it while no worker consumes its queue; a running job that reaches
its deadline ends ``timeout`` with its partial result."""
from __future__ import annotations

import json
import time

import pytest

from core import keys
from core.events import EXPIRED, TIMEOUT
from core.tasks import TASK_FOR_JOB_TYPE
from tests.harness.stack import wait_until
from tests.integration.conftest import gen_request, submit, wait_for_worker, wait_terminal

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shared_client(shared_stack):
    """A Celery client on the shared stack (``celery_client`` would flush a stack of its own)."""
    from celery import Celery

    app = Celery("miniserve-test-client", broker=shared_stack.redis_url)
    yield app
    app.close()


def log_events(proc, job_id: str) -> list[str]:
    """The names of the worker's JSON log events about ``job_id``, in order."""
    names = []
    for line in proc.log().splitlines():
        if job_id in line and line.startswith("{"):
            try:
                names.append(json.loads(line).get("event"))
            except ValueError:
                continue
    return names


def assert_never_ran(store, job_id: str) -> None:
    record = store.get(job_id)
    assert record.state == EXPIRED and record.error["code"] == "expired"
    assert record.attempt == 0 and record.started_at is None and record.worker == ""
    assert [(e.type, e.attempt) for e in store.events(job_id)] == [("expired", 0)]  # no `running` state


def test_the_sweep_expires_a_queued_job_no_worker_takes_and_its_message_is_skipped_later(stack, store,
                                                                                       celery_client):
    """The worker does not consume ``generation`` at first (only its reaper runs): the job's
    message waits there until the sweep has ended it; then the worker is told to consume
    ``generation`` (Celery's add_consumer), takes the message and skips it. (First in the
    module: its ``stack`` empties Redis, before the module's shared worker starts.)"""
    sweeper = stack.start_worker(name="sweeper", queues="bench")
    try:
        wait_for_worker(store)
        job = submit(store, celery_client, gen_request(max_new_tokens=8))  # no deadline: the control
        late = store.create("generate", "generation", gen_request(max_new_tokens=8), deadline=time.time() + 2)
        celery_client.send_task(TASK_FOR_JOB_TYPE["generate"], args=[late.id, 0], task_id=late.id,
                                queue="generation")
        store.mark_dispatched(late.id)
        wait_terminal(store, late.id, 60)
        assert_never_ran(store, late.id)
        assert store.get(job.id).state == "queued" and store.client.llen(keys.queue_key("generation")) == 2
        assert "job_expired" in log_events(sweeper, late.id)
        celery_client.control.add_consumer("generation", exchange="generation", routing_key="generation")
        assert wait_terminal(store, job.id, 90).state == "succeeded"
        wait_until(lambda: "job_skipped" in log_events(sweeper, late.id), 30, what="the late message skipped")
        assert store.client.llen(keys.queue_key("generation")) == 0
        assert_never_ran(store, late.id)
    finally:
        sweeper.stop()


def test_a_worker_that_receives_a_job_after_its_deadline_ends_it_unrun(shared_store, shared_client, shared_worker):
    job = shared_store.create("generate", "generation", gen_request(max_new_tokens=8), deadline=time.time() - 1)
    shared_client.send_task(TASK_FOR_JOB_TYPE["generate"], args=[job.id, 0], task_id=job.id, queue="generation")
    shared_store.mark_dispatched(job.id)
    wait_terminal(shared_store, job.id, 60)
    assert_never_ran(shared_store, job.id)
    wait_until(lambda: "job_expired" in log_events(shared_worker, job.id), 30, what="the worker's job_expired log")
    assert "job_started" not in log_events(shared_worker, job.id)


def test_a_running_job_that_reaches_its_deadline_ends_timeout_with_its_partial_result(shared_store, shared_client,
                                                                                      shared_worker):
    job = shared_store.create("generate", "generation", gen_request(max_new_tokens=100_000), deadline=time.time() + 8)
    shared_client.send_task(TASK_FOR_JOB_TYPE["generate"], args=[job.id, 0], task_id=job.id, queue="generation")
    shared_store.mark_dispatched(job.id)
    record = wait_terminal(shared_store, job.id, 90)
    assert record.state == TIMEOUT and record.error["message"] == "the job reached its deadline"
    assert record.error["partial"]["usage"]["completion_tokens"] > 0
    assert [e.type for e in shared_store.events(job.id)][0] == "state" and shared_store.events(job.id)[-1].type == "timeout"


@pytest.fixture(scope="module")
def line_web(shared_stack, shared_worker):
    """The web server in front of the module's worker."""
    from tests.integration.conftest import started_web

    proc, base_url = started_web(shared_stack)
    yield base_url
    proc.kill()  # teardown: no graceful stop is under test here


def test_queued_jobs_see_their_place_in_line_count_down(shared_store, line_web):
    """One worker, one job at a time: a job held running by the step gate holds it, three short
    ones wait. Their positions follow the order of submission; the last one's stream shows its
    place going down, never up, then its own start. The held job is cancelled and the gate
    opened to let them run."""
    import threading

    import requests

    from tests.harness.client import iter_sse
    from tests.harness.step_gate import StepGate

    web = line_web

    def post(max_new_tokens: int) -> str:
        reply = requests.post(f"{web}/jobs", json={"prompt": "Hello", "max_new_tokens": max_new_tokens,
                                                   "generation_method": "official"}, timeout=30)
        assert reply.status_code == 202, reply.text
        return reply.json()["id"]

    with StepGate.on(shared_store).closed(steps=1):  # the first job holds the worker, running
        held = post(64)
        wait_until(lambda: shared_store.get(held).state == "running", 60, what="the held job running")
        waiting = [post(4) for _ in range(3)]
        views = [requests.get(f"{web}/jobs/{job_id}", timeout=30).json() for job_id in waiting]
        assert [v["queue_position"] for v in views] == [0, 1, 2]
        seen: list[tuple[str, object]] = []

        def follow() -> None:
            with requests.get(f"{web}/jobs/{waiting[2]}/events", stream=True, timeout=120) as reply:
                for event in iter_sse(reply, place_frames=True):
                    seen.append((event.type, event.data["data"].get("queue_position", event.data["data"].get("state"))))
                    if event.type == "done":
                        return

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        wait_until(lambda: ("queued", 2) in seen, 30, what="the first place-in-line frame")
        requests.post(f"{web}/jobs/{held}/cancel", timeout=30)
    reader.join(120)
    assert not reader.is_alive() and all(shared_store.get(j).state == "succeeded" for j in waiting)
    positions = [value for kind, value in seen if kind == "queued"]
    assert positions[0] == 2 and positions == sorted(positions, reverse=True) and len(set(positions)) == len(positions)
    first_state = next(i for i, (kind, _) in enumerate(seen) if kind == "state")
    assert all(kind == "queued" for kind, _ in seen[:first_state]) and seen[first_state][1] == "running"
    starts = [shared_store.get(j).started_at for j in waiting]
    assert starts == sorted(starts)  # taken in the order of the line
