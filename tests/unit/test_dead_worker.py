"""A running job whose worker stopped beating is re-queued after ``dead_after_s`` (three
beats), not a whole lease later; a job whose worker beats is left alone, even when it
started long ago. The reaper's contact clock is stepped (tests/unit/test_reaper_grace.py);
heartbeats and starts are written into the past, so nothing here waits."""
from __future__ import annotations

import time

import pytest

from core import keys
from core.events import QUEUED, RUNNING
from core.jobs import JobStore
from core.workers import jobs_of_dead_workers
from tests.unit.test_dispatch import FakeCelery
from tests.unit.test_reaper_grace import FakeClock, FlakyRedis
from worker.reaper import Reaper

DEAD_AFTER_S = 15


@pytest.fixture
def stack():
    clock = FakeClock()
    client = FlakyRedis(decode_responses=True)
    client.clock = clock
    store = JobStore(client, ttl_s=600)
    reaper = Reaper(store, FakeCelery(), lease_s=600, interval_s=5, dead_after_s=DEAD_AFTER_S, clock=clock)
    return client, store, reaper, clock


def running_job(client, store, worker: str, started_ago_s: float, beat_ago_s: float | None) -> str:
    job = store.create("generate", "generation", {})
    store.mark_dispatched(job.id)
    store.start_attempt(job.id, worker, lease_s=600)  # the lease alone would wait ten minutes
    client.hset(keys.job_key(job.id), "started_at", repr(time.time() - started_ago_s))
    if beat_ago_s is not None:
        client.zadd(keys.WORKERS_INDEX, {worker: time.time() - beat_ago_s})
    return job.id


def test_only_jobs_of_silent_workers_are_dead(stack):
    client, store, _, _ = stack
    alive = running_job(client, store, "host:1", started_ago_s=300, beat_ago_s=2)
    silent = running_job(client, store, "host:2", started_ago_s=300, beat_ago_s=40)
    gone = running_job(client, store, "host:3", started_ago_s=300, beat_ago_s=None)
    just_started = running_job(client, store, "host:4", started_ago_s=1, beat_ago_s=None)
    assert sorted(jobs_of_dead_workers(client, DEAD_AFTER_S)) == sorted([silent, gone])
    assert alive and just_started


def test_the_reaper_requeues_a_dead_workers_job_once_in_touch_long_enough(stack):
    client, store, reaper, clock = stack
    job_id = running_job(client, store, "host:2", started_ago_s=300, beat_ago_s=40)
    assert reaper.tick()["requeued"] == []  # first contact: a live worker may not have beaten yet
    clock.advance(DEAD_AFTER_S - 5)
    for _ in range(2):
        reaper.tick()
        assert store.get(job_id).state == RUNNING
        clock.advance(2.5)
    assert reaper.tick()["requeued"] == [job_id]  # in touch for 15 s: long before the 600 s lease
    record = store.get(job_id)
    assert record.state == QUEUED and record.dispatch == 1  # the dead attempt's message is stale
    reasons = [e.data.get("reason") for e in store.events(job_id) if e.type == "state"]
    assert reasons[-1] == "worker_dead"
    assert reaper.celery_app.sent[-1]["task_id"] == job_id


def test_a_worker_that_beats_keeps_its_job(stack):
    client, store, reaper, clock = stack
    job_id = running_job(client, store, "host:1", started_ago_s=3600, beat_ago_s=1)
    reaper.tick()
    clock.advance(DEAD_AFTER_S + 1)
    assert reaper.tick()["requeued"] == []
    assert store.get(job_id).state == RUNNING
