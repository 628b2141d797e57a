"""Deadlines in the job protocol (fakeredis): a queued job past its deadline ends ``expired``
unrun, whether a worker's start finds it or the sweep does; a running one is left to its
worker (which ends it ``timeout``)."""
import time

import fakeredis
import pytest

from core import keys
from core.events import EXPIRED, QUEUED, RUNNING, SUCCEEDED, TERMINAL_EVENTS
from core.jobs import JobStore


@pytest.fixture
def store():
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=60)


def test_a_start_after_the_deadline_ends_the_job_expired_without_an_attempt(store):
    job = store.create("generate", "generation", {}, deadline=time.time() - 1)
    started = store.start_attempt(job.id, "w1", lease_s=30)
    assert not started.should_run and started.attempt == -2
    record = store.get(job.id)
    assert record.state == EXPIRED and record.attempt == 0 and record.started_at is None
    assert record.error["code"] == "expired"
    assert [(e.type, e.attempt) for e in store.events(job.id)] == [("expired", 0)]
    assert store.client.zscore(keys.LEASES, job.id) is None
    assert store.client.zscore(keys.DEADLINES, job.id) is None
    assert store.start_attempt(job.id, "w1", lease_s=30).attempt == 0  # a second delivery: nothing


def test_a_start_before_the_deadline_runs(store):
    job = store.create("generate", "generation", {}, deadline=time.time() + 60)
    assert store.start_attempt(job.id, "w1", lease_s=30).should_run
    assert store.get(job.id).deadline == pytest.approx(job.deadline)


def test_the_sweep_expires_queued_jobs_only(store):
    now = time.time()
    due = store.create("generate", "generation", {}, deadline=now + 5)
    later = store.create("generate", "generation", {}, deadline=now + 50)
    running = store.create("generate", "generation", {}, deadline=now + 5)
    plain = store.create("generate", "generation", {})
    store.start_attempt(running.id, "w1", lease_s=30)
    assert store.expire_overdue(now=now + 1) == []
    assert store.expire_overdue(now=now + 10) == [due.id]
    assert store.get(due.id).state == EXPIRED and store.get(later.id).state == QUEUED
    assert store.get(running.id).state == RUNNING and store.get(plain.id).state == QUEUED
    assert store.expire_overdue(now=now + 10) == []  # once
    assert sum(e.type in TERMINAL_EVENTS for e in store.events(due.id)) == 1
    store.finish(running.id, SUCCEEDED, {"text": ""}, attempt=1)
    assert store.client.zrange(keys.DEADLINES, 0, -1) == [later.id]  # ended jobs leave the set
    assert store.client.zscore(keys.UNDISPATCHED, due.id) is None


def test_an_expired_job_cannot_finish_again(store):
    job = store.create("generate", "generation", {}, deadline=time.time() + 1)
    store.expire_overdue(now=time.time() + 2)
    assert store.finish(job.id, SUCCEEDED, {"text": "late"}) == 0
    assert store.get(job.id).state == EXPIRED


def test_endings_of_a_job_with_a_webhook_enter_the_outbox_once(store):
    now = time.time()
    hooked = store.create("generate", "generation", {}, deadline=now + 1, webhook_url="https://example.com/h")
    plain = store.create("generate", "generation", {}, deadline=now + 1)
    store.expire_overdue(now=now + 2)
    assert store.client.zrange(keys.WEBHOOK_OUTBOX, 0, -1) == [hooked.id]
    done = store.create("generate", "generation", {}, webhook_url="https://example.com/h")
    store.start_attempt(done.id, "w1", lease_s=30)
    store.finish(done.id, SUCCEEDED, {"text": "x"}, attempt=1)
    assert set(store.client.zrange(keys.WEBHOOK_OUTBOX, 0, -1)) == {hooked.id, done.id}
    assert plain.id not in store.client.zrange(keys.WEBHOOK_OUTBOX, 0, -1)


def test_idempotent_create_keeps_the_deadline(store):
    job, replayed = store.create_idempotent("generate", "generation", {}, idempotency_key="k",
                                            deadline=time.time() + 30, webhook_url="https://example.com/h")
    again, replayed_again = store.create_idempotent("generate", "generation", {}, idempotency_key="k")
    assert not replayed and replayed_again and again.id == job.id
    assert store.client.zscore(keys.DEADLINES, job.id) == pytest.approx(job.deadline)
    assert store.get(job.id).webhook_url == "https://example.com/h"


def test_the_jobs_deadline_caps_the_attempts_limit_and_does_not_pause(store):
    """The per-attempt limit pauses while a request waits for the engine loop; the job's own
    deadline does not: reached while waiting, the job stops ``timeout`` all the same."""
    from worker.job_runner import JobContext, monotonic_deadline

    job = store.create("generate", "generation", {}, deadline=time.time() + 30)
    started = store.start_attempt(job.id, "w1", lease_s=30)
    ctx = JobContext(store, store.get(job.id), started.attempt, deadline=time.monotonic() + 600,
                     job_deadline=monotonic_deadline(store.get(job.id).deadline))
    assert 29 < ctx.time_left() <= 30 and not ctx.should_cancel()
    ctx.pause_clock()
    ctx.job_deadline = time.monotonic() - 0.001  # the deadline passes while the request waits
    assert ctx.should_cancel() and ctx.stopped_reason == "timeout" and ctx.time_left() == 0
    plain = JobContext(store, store.get(job.id), started.attempt, deadline=time.monotonic() + 600)
    plain.pause_clock()
    assert not plain.should_cancel() and plain.time_left() > 599


def test_a_place_in_line_follows_the_order_of_sends_and_starts(store):
    from core.jobs import estimated_start

    jobs = [store.create("generate", "generation", {}) for _ in range(4)]
    for job in jobs:
        store.mark_dispatched(job.id, "generation")
    other = store.create("generate", "agent", {})
    store.mark_dispatched(other.id, "agent")
    assert [store.place_in_line(j.id)[0] for j in jobs] == [0, 1, 2, 3]
    assert store.place_in_line(other.id)[0] == 0  # lines are per queue
    assert store.place_in_line(jobs[0].id)[1] is None  # no starts measured yet
    store.start_attempt(jobs[0].id, "w", lease_s=30)
    store.request_cancel(jobs[2].id)  # an ending leaves the line too
    assert store.place_in_line(jobs[0].id) is None and store.place_in_line(jobs[2].id) is None
    assert [store.place_in_line(j.id)[0] for j in (jobs[1], jobs[3])] == [0, 1]
    store.start_attempt(jobs[1].id, "w", lease_s=30)
    assert store.place_in_line(jobs[3].id)[0] == 0 and store.place_in_line(jobs[3].id)[1] is not None
    assert estimated_start(2, [100.0, 110.0, 120.0], now=125.0) == 150.0  # one start per 10 s
    assert estimated_start(0, [100.0], now=125.0) is None


def test_a_job_that_started_before_its_send_was_confirmed_never_joins_the_line(store):
    job = store.create("generate", "generation", {})
    store.start_attempt(job.id, "w", lease_s=30)
    store.mark_dispatched(job.id, "generation")
    assert store.place_in_line(job.id) is None
    assert store.client.zcard(keys.line_key("generation")) == 0
