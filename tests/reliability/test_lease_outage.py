"""A Redis outage longer than the lease re-queues no live job (issue 15, item 6), on a real
redis-server, real Celery workers and short leases (2 s; the outage lasts 3 s: every lease,
renewed each half second, has expired when Redis comes back).

Two jobs run when Redis goes away: A on a prefork worker that is SIGKILLed during the
outage (its attempt really died), B on a threads-pool worker that lives. When Redis comes
back every lease has expired. Before: the reapers re-queued both at once, and the free
worker ran a second, concurrent attempt of B. Now: B's worker renews at once and the
reapers wait one lease of unbroken contact, so B keeps attempt 1 to its end while A is
re-queued and starts attempt 2 on the live worker.

Both workers start (and load) together; A is sent to the doomed worker's own queue (as the
web routes a job to a worker that holds its prefix), its record naming the shared queue,
where the reaper re-queues it.

The step gate holds both jobs running across the outage (its key comes back with the
append-only file), however fast the CPU; they end when the test cancels them.
"""
from __future__ import annotations

import json
import time

import pytest

from core import keys
from core.events import CANCELLED, RUNNING
from core.tasks import QUEUE_FOR_JOB_TYPE, TASK_FOR_JOB_TYPE
from tests.harness.stack import wait_until
from tests.harness.step_gate import StepGate
from tests.integration.conftest import gen_request, submit, wait_for_worker, wait_terminal

pytestmark = pytest.mark.integration
LEASE_S = 2
OUTAGE_S = 3
LONG = 3800  # tokens: never reached, the step gate holds both jobs until they are cancelled


@pytest.fixture
def lease_stack(own_stack):
    own_stack.env_overrides.update(MINISERVE_LEASE_S=str(LEASE_S))
    return own_stack


def held_request(prompt: str) -> dict:
    return gen_request(prompt=prompt, max_new_tokens=LONG)


def tokens(store, job_id: str) -> int:
    return sum(1 for e in store.events(job_id) if e.type == "token")


def submit_to_own_queue(store, client, request: dict, node: str):
    """A job whose record names the shared queue, its task sent to ``node``'s own queue."""
    record = store.create("generate", QUEUE_FOR_JOB_TYPE["generate"], request)
    client.send_task(TASK_FOR_JOB_TYPE["generate"], args=[record.id, 0], task_id=record.id,
                     queue=keys.worker_queue(node))
    store.mark_dispatched(record.id)
    return record


def started_events(log: str, job_id: str) -> int:
    """How many attempts of ``job_id`` a worker's JSON log says it started."""
    count = 0
    for line in log.splitlines():
        if '"job_started"' in line and job_id in line:
            count += json.loads(line[line.index("{"):]).get("job_id") == job_id
    return count


def test_outage_longer_than_the_lease_requeues_only_the_dead_attempt(restartable_redis, lease_stack, own_store):
    from celery import Celery

    client = Celery("lease-outage-test", broker=lease_stack.redis_url)
    doomed = lease_stack.start_worker(name="doomed", pool="prefork", concurrency=1)
    live = lease_stack.start_worker(name="live", pool="threads", concurrency=4)
    try:
        nodes = {w["info"]["node"] for w in wait_for_worker(own_store, 2)}
        with StepGate.on(own_store).closed() as gate:  # both jobs run only the steps given them
            job_a = submit_to_own_queue(own_store, client, held_request("a long one"),
                                        next(n for n in nodes if n.startswith("doomed@")))
            gate.allow_until(lambda: tokens(own_store, job_a.id) >= 1, "A's first tokens")
            assert own_store.get(job_a.id).worker.startswith("doomed@")
            job_b = submit(own_store, client, held_request("another long one"))
            gate.allow_until(lambda: tokens(own_store, job_b.id) >= 1, "B's first tokens")
            assert own_store.get(job_a.id).worker != own_store.get(job_b.id).worker

            restartable_redis.stop()
            doomed.kill()  # A's attempt dies with its worker while nobody can see it
            time.sleep(OUTAGE_S)
            restartable_redis.start()

            # Both leases expired in the outage, so the reaper pass that re-queued A looked at B's
            # lease too: B still on attempt 1 after it means B's worker renewed within the grace
            # period (no window waited out here: the order of A's re-queue and B's state decides).
            wait_until(lambda: own_store.get(job_a.id).attempt >= 2, 30, what="A re-queued and restarted")
            record_b = own_store.get(job_b.id)
            assert record_b.state == RUNNING and record_b.attempt == 1
            own_store.request_cancel(job_b.id)
            own_store.request_cancel(job_a.id)

        ended_a, ended_b = wait_terminal(own_store, job_a.id, 60), wait_terminal(own_store, job_b.id, 60)
        assert ended_a.state == CANCELLED and ended_a.attempt == 2, ended_a.error
        assert ended_b.state == CANCELLED and ended_b.attempt == 1
        reasons_b = [e.data.get("reason") for e in own_store.events(job_b.id) if e.type == "state"]
        assert not {"lease_expired", "worker_dead"} & set(reasons_b)
        assert started_events(live.log(), job_b.id) == 1  # never a second, concurrent attempt
        assert '"reaper_contact_restarted"' in live.log()
    finally:  # teardown: no graceful stop is under test here
        for proc in (doomed, live):
            proc.kill()
        client.close()
