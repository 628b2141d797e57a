"""Redis restarting under a running web server and Celery worker (issue 8, item 1).

While Redis is down the web answers 503 with a JSON error (never hangs, never a 500);
when it is back, web and worker reconnect by themselves (same processes), and with the
append-only file on, jobs that were queued during the restart survive it and complete.
"""
from __future__ import annotations

import threading
import time

import pytest
import requests

from concurrent.futures import ThreadPoolExecutor

from core.events import CANCELLED, RUNNING, SUCCEEDED
from tests.harness.bounded import returns
from tests.harness.client import iter_sse, submit_and_follow
from tests.harness.stack import wait_until
from tests.harness.step_gate import StepGate
from tests.integration.conftest import _started_worker, started_web, wait_terminal

pytestmark = pytest.mark.integration
LONG = 3500  # tokens: never reached, the step gate holds the blocker across the restart until it is cancelled
SHORT = {"prompt": "Hello after the restart", "max_new_tokens": 8}


@pytest.fixture(scope="module")
def running(own_stack, own_store):
    """Web + one prefork worker on the restartable Redis (kept across both tests: each
    restart must be survived by the same processes)."""
    worker = _started_worker(own_stack, own_store)
    web_proc, base = started_web(own_stack, MINISERVE_MAX_NEW_TOKENS_CAP=str(LONG))
    yield base, worker, web_proc
    web_proc.kill()  # teardown: no graceful stop is under test here
    worker.kill()  # teardown: no graceful stop is under test here


def assert_503_json(reply: requests.Response) -> None:
    assert reply.status_code == 503, reply.text
    error = reply.json()["error"]
    assert error["code"] == "redis_unavailable" and "Redis" in error["message"]
    assert int(reply.headers["Retry-After"]) > 0


def wait_healthy(base: str, timeout_s: float = 20) -> None:
    def ok() -> bool:
        try:
            return requests.get(f"{base}/healthz", timeout=2).json().get("status") == "ok"
        except requests.RequestException:
            return False

    wait_until(ok, timeout_s, what="web healthy again")


def test_idle_restart_503_while_down_then_everything_reconnects(restartable_redis, running):
    base, worker, web_proc = running
    before = submit_and_follow(base, SHORT, timeout_s=60)
    assert before.terminal == "done"

    restartable_redis.stop()
    for call in (lambda: requests.post(f"{base}/jobs", json=SHORT, timeout=15),
                 lambda: requests.get(f"{base}/jobs/{before.job_id}", timeout=15),
                 lambda: requests.get(f"{base}/jobs", timeout=15)):
        assert_503_json(returns(call))  # answered (30 s net), never left hanging on the outage
    health = requests.get(f"{base}/healthz", timeout=15)
    assert health.status_code == 503 and health.json()["redis"] is False

    restartable_redis.start()
    wait_healthy(base)  # the worker's heartbeat is back too: status "ok" needs a live worker
    after = submit_and_follow(base, SHORT, timeout_s=60)
    assert after.terminal == "done"
    assert worker.popen.poll() is None and web_proc.popen.poll() is None  # same processes, no restart


def follow_with_resume(base: str, job_id: str, timeout_s: float = 90, connected: threading.Event | None = None) -> list:
    """Follow a job's SSE like a browser's EventSource: on a broken stream or an error answer,
    wait and reconnect with ``Last-Event-ID``; returns every event received. ``connected`` is set
    once a stream is open."""
    events, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        headers = {"Last-Event-ID": str(events[-1].id)} if events else {}
        try:
            with requests.get(f"{base}/jobs/{job_id}/events", stream=True, timeout=30, headers=headers) as reply:
                if reply.status_code == 200:
                    if connected is not None:
                        connected.set()
                    for event in iter_sse(reply):
                        events.append(event)
                        if event.type in ("done", "error", "cancelled", "timeout"):
                            return events
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"no terminal event for {job_id}")


def test_queued_jobs_survive_a_restart_with_appendonly(restartable_redis, running, own_store):
    base, worker, _ = running
    gate = StepGate.on(own_store)
    with gate.closed(steps=3):  # the blocker holds the worker, running, across the restart (the key is in the AOF)
        blocker = requests.post(f"{base}/jobs", json={"prompt": "keep the worker busy", "max_new_tokens": LONG},
                                timeout=10).json()["id"]
        wait_until(lambda: own_store.get(blocker).state == RUNNING, 30, what="blocker running")
        queued = [requests.post(f"{base}/jobs", json={**SHORT, "prompt": f"queued {i}"}, timeout=10).json()["id"]
                  for i in range(3)]
        assert [own_store.get(j).state for j in queued] == ["queued"] * 3
        assert own_store.queue_depths()["generation"] == 3  # messages, and jobs held at the fair gate
        with ThreadPoolExecutor(1) as pool:  # a client follows a queued job's stream across the restart
            connected = threading.Event()
            followed = pool.submit(follow_with_resume, base, queued[0], connected=connected)
            assert connected.wait(30)  # its stream is open before the restart
            restart_and_check(restartable_redis, running, own_store, blocker, queued, gate)
            events = followed.result(timeout=120)
    seqs = [e.id for e in events]
    assert seqs == list(range(1, len(seqs) + 1)) and events[-1].type == "done"  # nothing lost or repeated
    streamed = "".join(e.data["data"]["text"] for e in events if e.type == "token")
    assert streamed == own_store.get(queued[0]).result["text"]
    web_log = running[2].log()
    assert '"sse_redis_lost"' in web_log and "Error handling request" not in web_log  # ended cleanly


def restart_and_check(restartable_redis, running, own_store, blocker, queued, gate: StepGate) -> None:
    base, worker, _ = running
    restartable_redis.stop()
    time.sleep(1.0)
    restartable_redis.start()

    # The task messages, and the jobs held at the fair gate, came back from the append-only file.
    assert own_store.queue_depths()["generation"] == 3
    assert [own_store.get(j).state for j in queued] == ["queued"] * 3
    wait_healthy(base)
    assert own_store.get(blocker).state == RUNNING  # held through the outage
    assert requests.post(f"{base}/jobs/{blocker}/cancel", timeout=10).status_code in (200, 202)
    gate.open()
    ended = wait_terminal(own_store, blocker, 60)
    # The worker's Redis client retried through the outage: the running job kept its attempt.
    assert ended.state == CANCELLED and ended.attempt == 1, ended.error
    for job_id in queued:
        record = wait_terminal(own_store, job_id, 90)
        assert record.state == SUCCEEDED, (record.error, worker.log()[-3000:])
        assert record.attempt == 1
    assert worker.popen.poll() is None
