"""Cancellation by message (fakeredis, pub/sub included): a cancel reaches its running job
through the process's one subscription, and none is missed when the message is."""
from __future__ import annotations

import threading

import fakeredis
import pytest

from core import keys
from core.jobs import JobStore
from worker.cancel_watch import CancelWatch


SAFETY_S = 30  # a safety net only: every wait here ends as soon as its event is set


@pytest.fixture
def store():
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=60)


def running_job(store: JobStore) -> str:
    job = store.create("generate", "generation", {})
    store.start_attempt(job.id, "w1", 30)
    return job.id


class Counting:
    """The client, counting the commands it sends (pipelines count as one round trip)."""

    def __init__(self, client) -> None:
        self.inner, self.calls = client, 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name in ("exists", "pipeline"):
            self.calls += 1
        return attr


def test_a_cancel_reaches_the_running_job_by_message(store):
    watch = CancelWatch(store.client, sweep_s=60)  # no backstop sweep within the test
    job_id = running_job(store)
    with watch.watching(job_id) as cancelled:
        assert watch.subscribed.wait(SAFETY_S)
        assert not cancelled.is_set()
        store.request_cancel(job_id)
        assert cancelled.wait(SAFETY_S)


def test_request_cancel_raises_the_flag_and_publishes_the_id(store):
    pubsub = store.client.pubsub()
    pubsub.subscribe(keys.CANCELS)
    job_id = running_job(store)
    store.request_cancel(job_id)
    messages = [pubsub.get_message(timeout=SAFETY_S) for _ in range(2)]
    assert [m["data"] for m in messages if m and m["type"] == "message"] == [job_id]
    assert store.cancel_requested(job_id)


def test_a_cancel_published_before_the_job_was_watched_is_seen_at_once(store):
    watch = CancelWatch(store.client, sweep_s=60)
    job_id = running_job(store)
    store.request_cancel(job_id)  # nobody subscribed yet: the message is gone, the flag stays
    with watch.watching(job_id) as cancelled:
        assert cancelled.is_set()


def test_a_lost_message_is_caught_by_the_sweep(store):
    watch = CancelWatch(store.client, sweep_s=0.2)
    job_id = running_job(store)
    with watch.watching(job_id) as cancelled:
        assert watch.subscribed.wait(SAFETY_S)
        store.client.set(keys.cancel_key(job_id), "1")  # a flag whose message never arrived
        assert cancelled.wait(SAFETY_S)
        assert watch.sweeps >= 1


def test_other_jobs_are_not_cancelled_and_a_finished_job_is_forgotten(store):
    watch = CancelWatch(store.client, sweep_s=60)
    first, second = running_job(store), running_job(store)
    with watch.watching(first) as one, watch.watching(second) as two:
        assert watch.subscribed.wait(SAFETY_S)
        store.request_cancel(first)
        assert one.wait(SAFETY_S)  # the message for ``first`` is handled: it named no other job
        assert not two.is_set()
    assert watch._jobs == {}


def test_running_jobs_cost_no_redis_call_per_check(store):
    """The job threads read an event; Redis is asked once when a job is registered and then
    once per sweep for all jobs together, however many run."""
    counting = Counting(store.client)
    watch = CancelWatch(counting, sweep_s=60)  # no timed sweep within the test: the test sweeps
    swept = threading.Semaphore(0)
    sweep = watch.sweep

    def counted_sweep() -> None:
        sweep()
        swept.release()

    watch.sweep = counted_sweep  # the thread's own sweeps (after subscribing) signal the test
    jobs = [running_job(store) for _ in range(8)]
    with watch.watching(jobs[0]) as first:
        for job_id in jobs[1:]:
            watch._jobs[job_id] = first  # seven more running jobs, registered without a look each
        assert swept.acquire(timeout=SAFETY_S)  # the sweep that follows the subscription
        before = counting.calls
        for _ in range(1000):
            assert not first.is_set()
        assert counting.calls == before  # a check is an event read, no Redis call
        watch.sweep()
        assert counting.calls == before + 1  # one pipeline for all eight jobs
        assert watch.sweeps == 2
