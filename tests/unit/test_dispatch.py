"""Job + Idempotency-Key in one atomic step, and the sweeper for queued jobs whose task
message was never sent (issue 15, item 7), on fakeredis (the Lua scripts run there too)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import fakeredis
import pytest

from core import keys
from core.events import FAILED, QUEUED, RUNNING
from core.jobs import JobStore
from worker.reaper import sweep_once


@dataclass
class FakeCelery:
    sent: list[dict] = field(default_factory=list)
    fail: bool = False

    def send_task(self, name, args=None, **options):
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append({"name": name, "args": list(args or []), **options})


@pytest.fixture
def store():
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=600)


def test_key_and_job_are_created_together(store):
    job, replayed = store.create_idempotent("generate", "generation", {"p": 1}, idempotency_key="k", owner="o")
    assert not replayed and store.get(job.id).state == QUEUED
    assert store.client.get(keys.idempotency_key("o", "k")) == job.id
    again, replayed = store.create_idempotent("generate", "generation", {"p": 2}, idempotency_key="k", owner="o")
    assert replayed and again.id == job.id and again.request == {"p": 1}
    other, replayed = store.create_idempotent("generate", "generation", {}, idempotency_key="k", owner="o2")
    assert not replayed and other.id != job.id  # keys are per owner
    assert store.client.ttl(keys.idempotency_key("o", "k")) > 0


def test_a_key_naming_a_missing_job_is_taken_over(store):
    """What the old two-step code left behind after a crash: a key pointing at nothing (it
    answered 409 to every retry for 7 days)."""
    store.client.set(keys.idempotency_key("o", "k"), "ghost", ex=600)
    job, replayed = store.create_idempotent("generate", "generation", {}, idempotency_key="k", owner="o")
    assert not replayed and store.client.get(keys.idempotency_key("o", "k")) == job.id


def test_concurrent_creations_with_one_key_make_one_job(store):
    results, barrier = [], threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        results.append(store.create_idempotent("generate", "generation", {}, idempotency_key="same", owner="o"))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({job.id for job, _ in results}) == 1
    assert sum(1 for _, replayed in results if not replayed) == 1
    assert store.client.zcard(keys.JOBS_INDEX) == 1


def test_the_create_script_is_one_step(store):
    """Nothing is written when the script sees another request's key: no half-created job."""
    store.client.set(keys.idempotency_key("o", "k"), "someone-else", ex=600)
    record = store._new_record("generate", "generation", {}, "o", 3, None)
    assert store._create(record, [keys.idempotency_key("o", "k")], "") == "someone-else"
    assert not store.client.exists(keys.job_key(record.id)) and store.client.zcard(keys.JOBS_INDEX) == 0


def test_sent_jobs_are_not_swept(store):
    job = store.create("generate", "generation", {})
    store.mark_dispatched(job.id)
    assert store.undispatched(0, now=job.created_at + 100) == []


def test_a_started_job_leaves_the_undispatched_set(store):
    job = store.create("generate", "generation", {})
    assert store.start_attempt(job.id, "w", 30).should_run
    assert store.undispatched(0, now=job.created_at + 100) == []


def test_unsent_job_is_re_sent_with_a_new_dispatch_number(store):
    job = store.create("generate", "generation", {})
    celery = FakeCelery()
    assert sweep_once(store, celery, older_than_s=60, max_redispatches=3) == []  # too young
    store.client.zadd(keys.UNDISPATCHED, {job.id: job.created_at - 120})
    assert sweep_once(store, celery, older_than_s=60, max_redispatches=3) == [job.id]
    assert celery.sent == [{"name": "miniserve.generate", "args": [job.id, 1], "task_id": job.id,
                            "queue": "generation"}]
    assert store.undispatched(0, now=job.created_at + 1000) == []  # confirmed
    assert not store.start_attempt(job.id, "w", 30, dispatch=0).should_run  # a late original is stale
    assert store.start_attempt(job.id, "w", 30, dispatch=1).should_run


def test_unsendable_job_ends_failed_with_a_reason(store):
    job = store.create("generate", "generation", {})
    celery = FakeCelery(fail=True)
    for _ in range(3):
        store.client.zadd(keys.UNDISPATCHED, {job.id: 0})
        with pytest.raises(ConnectionError):
            sweep_once(store, celery, older_than_s=60, max_redispatches=3)
        assert store.get(job.id).state == QUEUED
    store.client.zadd(keys.UNDISPATCHED, {job.id: 0})
    assert sweep_once(store, celery, older_than_s=60, max_redispatches=3) == []
    record = store.get(job.id)
    assert record.state == FAILED and record.error["code"] == "enqueue_failed"
    assert [e.type for e in store.events(job.id)] == ["error"]
    assert store.client.zcard(keys.UNDISPATCHED) == 0


def test_requeued_job_waits_for_its_re_send_to_be_confirmed(store):
    job = store.create("generate", "generation", {})
    store.mark_dispatched(job.id)
    started = store.start_attempt(job.id, "w", 30)
    assert store.get(job.id).state == RUNNING
    assert store.requeue(job.id, started.attempt) == 1
    assert store.undispatched(-1) == [job.id]  # a reaper that died before re-sending is covered
    store.mark_dispatched(job.id)
    assert store.undispatched(-1) == []
