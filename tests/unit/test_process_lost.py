"""A killed pool child's job is re-queued as soon as Celery re-delivers its message to the
child's replacement (worker.reaper.requeue_if_holder_gone), not a lease later: the attempt
holding the job names a process of this node that no longer exists. A live holder, or one of
another node, is left to its lease. fakeredis; the dead pid is a child process that ended."""
from __future__ import annotations

import os
import subprocess
import sys

import fakeredis
import pytest

from core.events import QUEUED, RUNNING, SUCCEEDED
from core.jobs import JobStore
from tests.unit.test_dispatch import FakeCelery
from worker.reaper import requeue_if_holder_gone

NODE = "prefork@host"


@pytest.fixture
def store():
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=600)


@pytest.fixture(scope="module")
def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def running_job(store: JobStore, worker: str) -> str:
    job = store.create("generate", "generation", {})
    store.mark_dispatched(job.id)
    store.start_attempt(job.id, worker, lease_s=3600)
    return job.id


def test_a_job_held_by_a_gone_process_of_this_node_is_requeued_at_once(store, dead_pid):
    job_id = running_job(store, f"{NODE}:{dead_pid}")
    celery = FakeCelery()
    assert requeue_if_holder_gone(store, celery, job_id, NODE)
    record = store.get(job_id)
    assert record.state == QUEUED and record.dispatch == 1  # the re-delivered message is now stale
    assert [e.data.get("reason") for e in store.events(job_id) if e.type == "state"][-1] == "process_lost"
    assert [m["task_id"] for m in celery.sent] == [job_id]
    assert store.start_attempt(job_id, f"{NODE}:{os.getpid()}", lease_s=60, dispatch=1).attempt == 2


@pytest.mark.parametrize("holder", ["alive", "other_node", "not_a_pid"])
def test_a_live_or_foreign_holder_keeps_the_job(store, dead_pid, holder):
    worker = {"alive": f"{NODE}:{os.getpid()}", "other_node": f"prefork@elsewhere:{dead_pid}",
              "not_a_pid": f"{NODE}"}[holder]
    job_id = running_job(store, worker)
    celery = FakeCelery()
    assert not requeue_if_holder_gone(store, celery, job_id, NODE)
    assert store.get(job_id).state == RUNNING and celery.sent == []


def test_an_ended_job_is_left_alone(store, dead_pid):
    job_id = running_job(store, f"{NODE}:{dead_pid}")
    store.finish(job_id, SUCCEEDED, {"text": "done"})
    assert not requeue_if_holder_gone(store, FakeCelery(), job_id, NODE)
    assert store.get(job_id).state == SUCCEEDED
