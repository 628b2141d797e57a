"""Access rules on the real stack (issue 8, item 3): ``python -m web`` with API keys, a rate
limit and a bounded queue, a real Celery worker behind it. The same rules are tested
in-process, case by case, in tests/web/test_access.py; here each one is shown once end to end.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from core import keys
from core.events import CANCELLED, RUNNING, SUCCEEDED
from tests.harness.stack import wait_until
from tests.harness.step_gate import StepGate
from tests.integration.conftest import _started_worker, started_web, wait_terminal

pytestmark = pytest.mark.integration
KEYS = ("key-alpha-1", "key-beta-2", "key-gamma-3")
A, B, C = ({"Authorization": f"Bearer {key}"} for key in KEYS)
RATE_LIMIT = 40  # per key per minute: A and B stay below it, C is used to hit it
QUEUE_LIMIT = 3
SHORT = {"prompt": "Hello", "max_new_tokens": 8}
LONG = 3500  # tokens: never reached, the step gate holds the blocker until it is cancelled


@pytest.fixture(scope="module")
def secured(shared_stack, shared_store):
    shared_stack.env_overrides.update(MINISERVE_API_KEYS=",".join(KEYS), MINISERVE_WEB_WORKERS="1",
                                      MINISERVE_RATE_LIMIT_PER_MINUTE=str(RATE_LIMIT),
                                      MINISERVE_MAX_QUEUE_DEPTH=str(QUEUE_LIMIT),
                                      MINISERVE_MAX_NEW_TOKENS_CAP=str(LONG))
    worker = _started_worker(shared_stack, shared_store)
    web_proc, base = started_web(shared_stack)
    yield base, shared_store
    web_proc.kill()  # teardown: no graceful stop is under test here
    worker.kill()  # teardown: no graceful stop is under test here


def post_job(base: str, headers: dict, body: dict = SHORT, idempotency_key: str | None = None) -> requests.Response:
    extra = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return requests.post(f"{base}/jobs", json=body, headers={**headers, **extra}, timeout=10)


def test_401_without_a_valid_key_and_nothing_is_enqueued(secured):
    base, store = secured
    before = store.client.zcard(keys.JOBS_INDEX)
    for headers in ({}, {"Authorization": "Bearer not-a-key"}, {"Authorization": KEYS[0]}):
        reply = post_job(base, headers)
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "unauthorized"
        assert reply.headers["WWW-Authenticate"] == "Bearer"
    assert requests.get(f"{base}/jobs", timeout=10).status_code == 401
    assert requests.get(f"{base}/healthz", timeout=10).status_code == 200  # the one open endpoint
    assert store.client.zcard(keys.JOBS_INDEX) == before and store.client.llen("generation") == 0


def test_another_keys_job_is_404(secured):
    base, store = secured
    job_id = post_job(base, A).json()["id"]
    assert wait_terminal(store, job_id, 60).state == SUCCEEDED
    for method, path in (("get", f"/jobs/{job_id}"), ("get", f"/jobs/{job_id}/events"),
                         ("post", f"/jobs/{job_id}/cancel")):
        reply = getattr(requests, method)(base + path, headers=B, timeout=10)
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "job_not_found"
    assert requests.get(f"{base}/jobs/{job_id}", headers=A, timeout=10).json()["state"] == SUCCEEDED
    assert job_id not in [j["id"] for j in requests.get(f"{base}/jobs", headers=B, timeout=10).json()["jobs"]]


def test_rate_limit_429_with_retry_after(secured):
    base, _ = secured
    statuses = [requests.get(f"{base}/queues", headers=C, timeout=10) for _ in range(RATE_LIMIT + 1)]
    limited = [r for r in statuses if r.status_code == 429]
    assert limited, "no 429 after more requests than the limit"
    assert all(r.status_code == 200 for r in statuses[:RATE_LIMIT - 2])  # the window may turn once
    assert limited[0].json()["error"]["code"] == "rate_limited"
    assert 1 <= int(limited[0].headers["Retry-After"]) <= 60
    assert requests.get(f"{base}/queues", headers=A, timeout=10).status_code == 200  # per key


def test_idempotency_key_returns_the_same_job(secured):
    base, store = secured
    with ThreadPoolExecutor(5) as pool:  # five simultaneous retries of one submission
        replies = list(pool.map(lambda _: post_job(base, A, idempotency_key="order-42"), range(5)))
    ids = {r.json()["id"] for r in replies}
    assert len(ids) == 1 and all(r.status_code == 202 for r in replies)
    job_id = ids.pop()
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in replies) == 4
    record = wait_terminal(store, job_id, 60)
    later = post_job(base, A, idempotency_key="order-42")  # a retry after the job ended
    assert later.json()["id"] == job_id and later.headers["Idempotent-Replayed"] == "true"
    assert record.state == SUCCEEDED and record.attempt == 1  # ran once
    assert [e.type for e in store.events(job_id)].count("done") == 1
    assert post_job(base, B, idempotency_key="order-42").json()["id"] != job_id  # keys are per API key


def test_queue_depth_back_pressure(secured):
    base, store = secured
    with StepGate.on(store).closed(steps=3):  # the blocker holds the worker, running, until cancelled
        blocker = post_job(base, B, {"prompt": "busy", "max_new_tokens": LONG, "generation_method": "no_cache"}).json()["id"]
        wait_until(lambda: store.get(blocker).state == RUNNING, 30, what="blocker running")
        queued = [post_job(base, B).json()["id"] for _ in range(QUEUE_LIMIT)]
        before = store.client.zcard(keys.JOBS_INDEX)
        full = post_job(base, B)
        assert full.status_code == 503 and full.json()["error"]["code"] == "queue_full"
        assert int(full.headers["Retry-After"]) > 0
        assert store.client.zcard(keys.JOBS_INDEX) == before  # the rejected request left no job
        assert store.queue_depths()["generation"] == QUEUE_LIMIT  # messages, and jobs held at the fair gate
        requests.post(f"{base}/jobs/{blocker}/cancel", headers=B, timeout=10)
    assert wait_terminal(store, blocker, 30).state == CANCELLED
    for job_id in queued:
        assert wait_terminal(store, job_id, 60).state == SUCCEEDED
    assert post_job(base, B).status_code == 202  # the queue drained: accepted again
