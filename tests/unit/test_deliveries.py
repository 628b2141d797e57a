"""Messages stranded between the sender and a started job (issue 15, item 7, found by the
soak): a worker that took a message and died, before or while kombu recorded it as unacked."""
from __future__ import annotations

import base64
import json
import time

import fakeredis
import pytest

from core import keys
from core.deliveries import job_message, stranded_jobs
from core.jobs import JobStore
from tests.unit.test_dispatch import FakeCelery
from worker.reaper import sweep_once


def message(job_id: str, *args) -> dict:
    body = base64.b64encode(json.dumps([[job_id, *args], {}, {}]).encode()).decode()
    return {"body": body, "headers": {"id": job_id, "task": "miniserve.generate"},
            "properties": {"body_encoding": "base64", "delivery_tag": f"tag-{job_id}-{args}"}}


@pytest.fixture
def store():
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=600)


def pending_job(store: JobStore, sent_ago_s: float) -> str:
    job = store.create("generate", "generation", {})
    store.mark_dispatched(job.id)
    store.client.zadd(keys.PENDING, {job.id: time.time() - sent_ago_s})
    return job.id


def deliver(store: JobStore, job_id: str, ago_s: float, *args) -> None:
    msg = message(job_id, *args)
    tag = msg["properties"]["delivery_tag"]
    store.client.hset(keys.KOMBU_UNACKED, tag, json.dumps([msg, "", "generation"]))
    store.client.zadd(keys.KOMBU_UNACKED_INDEX, {tag: time.time() - ago_s})


def test_reads_job_messages():
    assert job_message(json.dumps(message("abc"))) == ("abc", 0)
    assert job_message(message("abc", 3)) == ("abc", 3)
    assert job_message(message("abc") | {"headers": {"id": "other"}}) is None
    assert job_message("not json") is None


def test_a_message_waiting_in_its_queue_is_not_stranded(store):
    job_id = pending_job(store, sent_ago_s=100)
    store.client.lpush(keys.queue_key("generation"), json.dumps(message(job_id)))
    assert stranded_jobs(store, older_than_s=10) == []


def test_a_recent_delivery_is_not_stranded_an_old_one_is(store):
    fresh, old = pending_job(store, 100), pending_job(store, 100)
    deliver(store, fresh, ago_s=2)
    deliver(store, old, ago_s=60)
    assert stranded_jobs(store, older_than_s=10) == [old]


def test_a_message_that_is_nowhere_is_stranded_but_only_once_old_enough(store):
    young, lost = pending_job(store, 2), pending_job(store, 100)
    assert stranded_jobs(store, older_than_s=10) == [lost]  # the young one may still be on its way

def test_only_the_current_dispatch_counts(store):
    job_id = pending_job(store, 100)
    store.client.hset(keys.job_key(job_id), "dispatch", 2)
    store.client.lpush(keys.queue_key("generation"), json.dumps(message(job_id, 1)))  # a stale one
    assert stranded_jobs(store, older_than_s=10) == [job_id]


def test_started_jobs_leave_the_pending_set(store):
    job_id = pending_job(store, 100)
    assert store.start_attempt(job_id, "w", 30).should_run
    assert store.client.zscore(keys.PENDING, job_id) is None
    assert stranded_jobs(store, older_than_s=10) == []


def test_the_sweeper_re_sends_a_stranded_job_once(store):
    job_id = pending_job(store, 100)
    celery = FakeCelery()
    assert sweep_once(store, celery, older_than_s=5, max_redispatches=3) == [job_id]
    assert celery.sent[0]["args"] == [job_id, 1]
    assert store.client.zscore(keys.PENDING, job_id) is not None  # pending again, from now
    assert sweep_once(store, celery, older_than_s=5, max_redispatches=3) == []
