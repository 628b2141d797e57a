"""The reaper judges leases fairly after an outage (issue 15, item 6): it reaps only after
one lease of unbroken contact with Redis, so leases that expired while nobody could renew
them are renewed by their live workers first. (The real outage: tests/reliability/test_lease_outage.py.)

The contact clock is the reaper's own (``Reaper.clock``): these tests step it, and expire a
lease by writing its deadline into the past, so nothing here waits or races the machine."""
from __future__ import annotations

import fakeredis
import pytest
import redis

from core import keys
from core.events import RUNNING
from core.jobs import JobStore
from tests.unit.test_dispatch import FakeCelery
from worker.reaper import Reaper

GRACE_S = 0.5
INTERVAL_S = 0.05  # a gap longer than 2 intervals + SLOW_CALL_S (1.1 s) means a stalled loop


class FakeClock:
    """A monotonic clock that moves only when a test (or a slow ping) moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FlakyRedis(fakeredis.FakeRedis):
    """fakeredis whose PING can fail or be slow (the clock moves on during it), as a Redis
    restart looks to a client."""

    down = False
    delay_s = 0.0
    clock: FakeClock

    def ping(self, **kwargs):
        if self.down:
            raise redis.ConnectionError("down")
        self.clock.advance(self.delay_s)
        return super().ping(**kwargs)


@pytest.fixture
def setup():
    clock = FakeClock()
    client = FlakyRedis(decode_responses=True)
    client.clock = clock
    store = JobStore(client, ttl_s=600)
    job = store.create("generate", "generation", {})
    store.mark_dispatched(job.id)
    store.start_attempt(job.id, "w", lease_s=600)  # expires only when a test says so
    reaper = Reaper(store, FakeCelery(), lease_s=1, interval_s=INTERVAL_S, grace_s=GRACE_S, clock=clock)
    return client, store, job, reaper, clock


def expire_lease(client: redis.Redis, job_id: str) -> None:
    """The lease's deadline passed (nobody renewed it): its deadline is in the past."""
    client.zadd(keys.LEASES, {job_id: 1.0}, xx=True)


def tick(reaper: Reaper) -> dict:
    try:
        return reaper.tick()
    except redis.ConnectionError:
        reaper.lost_contact()
        return {}


def test_no_reaping_until_a_grace_period_of_contact(setup):
    client, store, job, reaper, clock = setup
    expire_lease(client, job.id)
    assert tick(reaper)["requeued"] == []  # first contact: the clock starts
    clock.advance(GRACE_S - 0.1)
    assert tick(reaper)["requeued"] == []  # in touch, but not yet for a grace period
    clock.advance(0.2)
    assert tick(reaper)["requeued"] == [job.id]


def test_an_outage_restarts_the_grace_period(setup):
    client, store, job, reaper, clock = setup
    tick(reaper)
    clock.advance(0.6)
    client.down = True
    assert tick(reaper) == {}
    clock.advance(0.6)
    expire_lease(client, job.id)  # the outage outlasts the lease
    client.down = False
    assert tick(reaper)["requeued"] == []  # back: the lease looks expired, but no reaping yet
    store.renew_lease(job.id, lease_s=600)  # the live worker renews at once on reconnect
    clock.advance(0.6)
    assert tick(reaper)["requeued"] == []
    assert store.get(job.id).state == RUNNING and store.get(job.id).attempt == 1


def test_a_call_held_up_by_reconnect_retries_counts_as_an_outage(setup):
    client, store, job, reaper, clock = setup
    tick(reaper)
    expire_lease(client, job.id)
    client.delay_s = 1.05  # the client rode out an outage inside its retries (no gap between ticks)
    assert tick(reaper)["requeued"] == []
    client.delay_s = 0
    assert tick(reaper)["requeued"] == []


def test_a_stalled_loop_restarts_the_grace_period(setup):
    client, store, job, reaper, clock = setup
    tick(reaper)
    clock.advance(0.6)
    assert tick(reaper)["requeued"] == []  # in touch past the grace period; the lease holds
    expire_lease(client, job.id)
    clock.advance(1.3)  # far longer than two intervals: this process was frozen
    assert tick(reaper)["requeued"] == []
