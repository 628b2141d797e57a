"""Stress on the real stack (issue 15): 32 concurrent ``paged`` jobs on the tiny fp32 model,
through the web server and one threads-pool worker (its engine loop batches them all).

Some are cancelled at random moments, one fails on purpose (a request the worker cannot
run), some have stop strings; meanwhile an agent job with a 1 MB hostile prompt runs.
Every job must end with exactly one terminal event; every job that was neither cancelled
nor broken must produce exactly its solo greedy output (run first, one job at a time); no
streaming job may go more than 2 s without a token event, and the worker's heartbeat must
stay fresh (a 1 MB prompt once froze a worker for over an hour).
"""
from __future__ import annotations

import random
import threading
import time

import pytest
import requests

from core.events import CANCELLED, FAILED, SUCCEEDED, TERMINAL_EVENTS
from core.tasks import QUEUE_FOR_JOB_TYPE, TASK_FOR_JOB_TYPE
from core.workers import list_workers
from tests.harness.stack import wait_until
from tests.integration.conftest import _started_worker, started_web, wait_terminal

pytestmark = pytest.mark.integration
JOBS = 32
CANCELLED_JOBS = {3, 9, 14, 21, 27}
STOP_JOBS = {1, 5, 11, 17, 23, 29}
MAX_GAP_S = 2.0
HOSTILE = "-" * 1_000_000


def body(i: int) -> dict:
    out = {"prompt": f"Stress job {i}: tell me about the sea and the sky.", "max_new_tokens": 24 + (i % 4) * 8,
           "generation_method": "paged", "temperature": 0}
    if i in STOP_JOBS:
        out["stop"] = ["e", "的"]
    return out


@pytest.fixture
def stress_stack(stack, store):
    worker = _started_worker(stack, store, pool="threads", concurrency=40, MINISERVE_MAX_BATCH="32")
    web, base = started_web(stack, MINISERVE_WEB_WORKERS="1")
    yield base, worker
    web.kill()  # teardown: no graceful stop is under test here
    worker.kill()  # teardown: no graceful stop is under test here


def post(base: str, payload: dict) -> str:
    reply = requests.post(f"{base}/jobs", json=payload, timeout=30)
    assert reply.status_code == 202, reply.text[:300]
    return reply.json()["id"]


def enqueue(store, celery_client, job_type: str, request: dict) -> str:
    """Straight into Redis and the queue, as the web would, for what the web refuses: the
    1 MB prompt (the tiny model's tokenizer counts a million tokens) and a broken request."""
    record = store.create(job_type, QUEUE_FOR_JOB_TYPE[job_type], request)
    celery_client.send_task(TASK_FOR_JOB_TYPE[job_type], args=[record.id, 0], task_id=record.id,
                            queue=record.queue)
    store.mark_dispatched(record.id)
    return record.id


def solo_texts(base: str, store) -> dict[int, str]:
    """Each job's output when it runs alone (greedy), one at a time."""
    texts = {}
    for i in range(JOBS):
        if i in CANCELLED_JOBS:
            continue
        record = wait_terminal(store, post(base, body(i)), 60)
        assert record.state == SUCCEEDED, record.error
        texts[i] = record.result["text"]
    return texts


class HeartbeatWatch(threading.Thread):
    """Polls the worker's heartbeat age until stopped; keeps the largest seen."""

    def __init__(self, store) -> None:
        super().__init__(daemon=True)
        self.store, self.stop, self.worst = store, threading.Event(), 0.0

    def run(self) -> None:
        while not self.stop.wait(0.25):
            workers = list_workers(self.store.client, max_age_s=120)
            self.worst = max([self.worst, *(w["age_s"] for w in workers)]) if workers else 999.0


def token_gaps(store, job_id: str) -> float:
    stamps = [e.ts for e in store.events(job_id) if e.type == "token"]
    return max((b - a for a, b in zip(stamps, stamps[1:])), default=0.0)


def test_32_concurrent_paged_jobs_with_cancels_a_failure_stops_and_a_hostile_prompt(stress_stack, store,
                                                                                    celery_client):
    base, worker = stress_stack
    started = time.monotonic()
    expected = solo_texts(base, store)
    watch = HeartbeatWatch(store)
    watch.start()

    ids = {i: post(base, body(i)) for i in range(JOBS)}
    wait_until(lambda: sum(e.type == "token" for j in ids.values() for e in store.events(j)) >= JOBS, 30,
               what="the batch streaming")
    hostile = enqueue(store, celery_client, "agent", {
        "messages": [{"role": "user", "content": HOSTILE}], "prefix": None, "method": "paged", "tools": None,
        "max_steps": 3, "sampling": {"max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                                     "repetition_penalty": None, "seed": None, "stop": []}})
    broken = enqueue(store, celery_client, "generate", {"messages": "not a list", "method": "paged"})
    rng = random.Random(15)
    for i in sorted(CANCELLED_JOBS):
        time.sleep(rng.uniform(0.0, 0.3))
        requests.post(f"{base}/jobs/{ids[i]}/cancel", timeout=10)

    records = {i: wait_terminal(store, job_id, 60) for i, job_id in ids.items()}
    hostile_record = wait_terminal(store, hostile, 60)
    broken_record = wait_terminal(store, broken, 30)
    watch.stop.set()

    every = [*ids.values(), hostile, broken]
    for job_id in every:
        terminal = [e.type for e in store.events(job_id) if e.type in TERMINAL_EVENTS]
        assert len(terminal) == 1, (job_id, terminal)
    assert broken_record.state == FAILED and broken_record.error["code"] in ("bad_request", "internal_error")
    assert hostile_record.is_terminal  # whatever the tiny model made of it, it ended
    for i, record in records.items():
        if i in CANCELLED_JOBS:
            assert record.state in (CANCELLED, SUCCEEDED)
            continue
        assert record.state == SUCCEEDED, (i, record.error)
        assert record.result["text"] == expected[i], f"job {i} differs from its solo run"
        streamed = "".join(e.data["text"] for e in store.events(ids[i]) if e.type == "token")
        assert streamed == expected[i]
    gaps = {i: token_gaps(store, job_id) for i, job_id in ids.items()}
    assert max(gaps.values()) < MAX_GAP_S, gaps
    assert watch.worst < 8.0, f"heartbeat went {watch.worst:.1f}s stale"
    assert time.monotonic() - started < 90
    assert worker.popen.poll() is None
