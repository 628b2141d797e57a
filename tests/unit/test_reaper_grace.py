"""The reaper judges leases fairly after an outage (issue 15, item 6): it reaps only after
one lease of unbroken contact with Redis, so leases that expired while nobody could renew
them are renewed by their live workers first. (The real outage: tests/reliability/test_lease_outage.py.)"""
from __future__ import annotations

import time

import fakeredis
import pytest
import redis

from core.events import RUNNING
from core.jobs import JobStore
from tests.unit.test_dispatch import FakeCelery
from worker.reaper import Reaper


class FlakyRedis(fakeredis.FakeRedis):
    """fakeredis whose PING can fail or be slow, as a Redis restart looks to a client."""

    down = False
    delay_s = 0.0

    def ping(self, **kwargs):
        if self.down:
            raise redis.ConnectionError("down")
        time.sleep(self.delay_s)
        return super().ping(**kwargs)


@pytest.fixture
def setup():
    client = FlakyRedis(decode_responses=True)
    store = JobStore(client, ttl_s=600)
    job = store.create("generate", "generation", {})
    store.mark_dispatched(job.id)
    store.start_attempt(job.id, "w", lease_s=1)
    return client, store, job, Reaper(store, FakeCelery(), lease_s=1, interval_s=0.05, grace_s=0.5)


def tick(reaper: Reaper) -> dict:
    try:
        return reaper.tick()
    except redis.ConnectionError:
        reaper.lost_contact()
        return {}


def test_no_reaping_until_a_grace_period_of_contact(setup):
    client, store, job, reaper = setup
    time.sleep(1.1)  # the lease expired
    assert tick(reaper)["requeued"] == []  # first contact: the clock starts
    time.sleep(0.6)
    assert tick(reaper)["requeued"] == [job.id]


def test_an_outage_restarts_the_grace_period(setup):
    client, store, job, reaper = setup
    tick(reaper)
    time.sleep(0.6)
    client.down = True
    assert tick(reaper) == {}
    time.sleep(1.1)  # the outage outlasts the lease
    client.down = False
    assert tick(reaper)["requeued"] == []  # back: the lease looks expired, but no reaping yet
    store.renew_lease(job.id, lease_s=5)  # the live worker renews at once on reconnect
    time.sleep(0.6)
    assert tick(reaper)["requeued"] == []
    assert store.get(job.id).state == RUNNING and store.get(job.id).attempt == 1


def test_a_call_held_up_by_reconnect_retries_counts_as_an_outage(setup):
    client, store, job, reaper = setup
    tick(reaper)
    time.sleep(0.6)
    client.delay_s = 1.2  # the client rode out an outage inside its retries
    time.sleep(1.1)
    assert tick(reaper)["requeued"] == []
    client.delay_s = 0
    assert tick(reaper)["requeued"] == []


def test_a_stalled_loop_restarts_the_grace_period(setup):
    client, store, job, reaper = setup
    tick(reaper)
    time.sleep(0.6)
    assert tick(reaper)["requeued"] == []  # lease (1 s) not expired yet
    time.sleep(1.3)  # far longer than two intervals: this process was frozen
    assert tick(reaper)["requeued"] == []
