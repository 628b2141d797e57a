"""Data expiry on the real stack (issue 8, item 4): with ``MINISERVE_JOB_TTL_S=3`` a job's
record and event stream carry a TTL from the moment it is created, keep it while the job
runs (even past the TTL), expire TTL seconds after the job ends, and the web then answers
404; the jobs index forgets them too. A job that never runs expires as well."""
from __future__ import annotations

import time

import pytest
import requests

from core import keys
from core.events import CANCELLED, RUNNING, SUCCEEDED
from tests.harness.stack import wait_until
from tests.harness.step_gate import StepGate
from tests.integration.conftest import _started_worker, started_web, wait_terminal

pytestmark = pytest.mark.integration
TTL_S = 3
LONG = 3500  # tokens: never reached, the step gate holds the job past the TTL until it is cancelled


@pytest.fixture(scope="module")
def ttl_stack(shared_stack, shared_store):
    """Web + a worker that consumes only the ``generation`` queue (agent jobs stay queued)."""
    shared_stack.env_overrides.update(MINISERVE_JOB_TTL_S=str(TTL_S), MINISERVE_WEB_WORKERS="1",
                                      MINISERVE_MAX_NEW_TOKENS_CAP=str(LONG))
    worker = _started_worker(shared_stack, shared_store, queues="generation")
    web_proc, base = started_web(shared_stack)
    yield base, shared_store
    web_proc.kill()  # teardown: no graceful stop is under test here
    worker.kill()  # teardown: no graceful stop is under test here


def ttl(store, key: str) -> int:
    return store.client.ttl(key)  # -2: no such key, -1: no TTL


def assert_gone(base: str, store, job_id: str) -> None:
    wait_until(lambda: not store.client.exists(keys.job_key(job_id), keys.events_key(job_id)),
               TTL_S + 3, what="job keys to expire")
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/events"):
        reply = requests.get(base + path, timeout=10)
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "job_not_found"
    # The worker's reaper loop trims expired ids from the index (every second with a 4 s lease).
    wait_until(lambda: store.client.zscore(keys.JOBS_INDEX, job_id) is None, 10, what="index trim")


def test_finished_job_expires_then_404(ttl_stack):
    base, store = ttl_stack
    job_id = requests.post(f"{base}/jobs", json={"prompt": "short lived", "max_new_tokens": 8}, timeout=10).json()["id"]
    assert 0 < ttl(store, keys.job_key(job_id)) <= TTL_S  # a TTL from creation on
    record = wait_terminal(store, job_id, 60)
    assert record.state == SUCCEEDED
    assert 0 < ttl(store, keys.job_key(job_id)) <= TTL_S
    assert 0 < ttl(store, keys.events_key(job_id)) <= TTL_S
    assert requests.get(f"{base}/jobs/{job_id}", timeout=10).status_code == 200
    assert_gone(base, store, job_id)


def test_running_job_outlives_the_ttl_and_expires_after_its_end(ttl_stack):
    base, store = ttl_stack
    with StepGate.on(store).closed(steps=3):  # the job stays running past the TTL until cancelled
        job_id = requests.post(f"{base}/jobs", json={"prompt": "a long one", "max_new_tokens": LONG},
                               timeout=10).json()["id"]
        wait_until(lambda: store.get(job_id).state == RUNNING, 30, what="job running")
        time.sleep(TTL_S + 1.5)  # past the TTL: the lease renewals keep the record alive
        assert store.get(job_id).state == RUNNING
        assert requests.get(f"{base}/jobs/{job_id}", timeout=10).json()["state"] == RUNNING
        assert 0 < ttl(store, keys.job_key(job_id)) <= TTL_S
        requests.post(f"{base}/jobs/{job_id}/cancel", timeout=10)
    assert wait_terminal(store, job_id, 30).state == CANCELLED
    assert_gone(base, store, job_id)


def test_job_that_never_runs_expires_too(ttl_stack):
    base, store = ttl_stack
    reply = requests.post(f"{base}/jobs", json={"type": "agent", "prompt": "nobody consumes the agent queue"},
                          timeout=10)
    job_id = reply.json()["id"]
    assert store.get(job_id).state == "queued" and 0 < ttl(store, keys.job_key(job_id)) <= TTL_S
    assert_gone(base, store, job_id)
