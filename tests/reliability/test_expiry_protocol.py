"""Expiry rules of the job protocol on fakeredis (fast): every key a job writes has a TTL
at every stage, a running job's TTL is renewed with its lease, and expired ids leave the
jobs index."""
import fakeredis
import pytest

from core import keys
from core.events import SUCCEEDED
from core.jobs import JobStore

TTL = 60


@pytest.fixture
def store():
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=TTL)


def ttls(store, job_id):
    return store.client.ttl(keys.job_key(job_id)), store.client.ttl(keys.events_key(job_id))


def test_every_stage_has_a_ttl(store):
    job = store.create("generate", "generation", {})
    assert 0 < ttls(store, job.id)[0] <= TTL
    store.client.expire(keys.job_key(job.id), 5)  # a long queue wait ate most of it
    started = store.start_attempt(job.id, "w1", lease_s=30)
    assert all(TTL - 2 <= t <= TTL for t in ttls(store, job.id))  # starting gives the full TTL back
    store.append_event(job.id, started.attempt, "token", {"text": "x"})
    store.request_cancel(job.id)
    assert 0 < store.client.ttl(keys.cancel_key(job.id)) <= TTL
    store.client.expire(keys.job_key(job.id), 5)
    store.client.expire(keys.events_key(job.id), 5)
    store.renew_lease(job.id, lease_s=30)  # the lease keeper's tick renews both TTLs
    assert all(TTL - 2 <= t <= TTL for t in ttls(store, job.id))
    assert store.finish(job.id, SUCCEEDED, {"text": "x"}, attempt=started.attempt)
    assert all(0 < t <= TTL for t in ttls(store, job.id))
    store.client.expire(keys.job_key(job.id), 5)
    store.renew_lease(job.id, lease_s=30)  # a late tick after the end no longer extends it
    assert ttls(store, job.id)[0] <= 5


def test_requeue_renews_the_ttl(store):
    job = store.create("generate", "generation", {})
    started = store.start_attempt(job.id, "w1", lease_s=30)
    store.client.expire(keys.job_key(job.id), 5)
    assert store.requeue(job.id, started.attempt) == 1
    assert ttls(store, job.id)[0] > 5


def test_trim_index_drops_expired_ids_oldest_first(store):
    jobs = [store.create("generate", "generation", {}) for _ in range(8)]
    store.client.zadd(keys.JOBS_INDEX, {j.id: i for i, j in enumerate(jobs)})  # distinct creation times
    for i in (0, 1, 2, 3, 5, 7):
        store.client.delete(keys.job_key(jobs[i].id))  # expired
    # Batches of 2 from the oldest: [0 1] [2 3] all gone, [4 5] holds a live job: stop there.
    assert store.trim_index(batch=2) == 5
    assert store.client.zrange(keys.JOBS_INDEX, 0, -1) == [jobs[4].id, jobs[6].id, jobs[7].id]
    assert [j.id for j in store.list()] == [jobs[6].id, jobs[4].id]  # list() drops the newer gone one
    assert store.client.zrange(keys.JOBS_INDEX, 0, -1) == [jobs[4].id, jobs[6].id]
