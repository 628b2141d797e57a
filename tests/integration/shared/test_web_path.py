"""The whole path a user takes: HTTP -> web -> Redis -> Celery worker -> Redis -> web (SSE)."""
from __future__ import annotations

import pytest
import requests

from core import keys
from core.events import CANCELLED, SUCCEEDED
from tests.harness.client import iter_sse, submit_and_follow
from tests.harness.step_gate import StepGate
from tests.integration.conftest import sleep_until_tokens, wait_state, wait_terminal

pytestmark = pytest.mark.integration


def poll_until_done(base_url: str, job_id: str, timeout_s: float = 60) -> dict:
    from tests.harness.stack import wait_until

    wait_until(lambda: requests.get(f"{base_url}/jobs/{job_id}").json()["state"]
               not in ("queued", "running"), timeout_s, what="job end")
    return requests.get(f"{base_url}/jobs/{job_id}").json()


def test_submit_and_poll_to_succeeded(web, worker):
    reply = requests.post(f"{web}/jobs", json={"prompt": "Hello there", "max_new_tokens": 12})
    assert reply.status_code == 202
    body = reply.json()
    assert body["state"] == "queued" and body["links"]["events"].endswith(f"/jobs/{body['id']}/events")
    job = poll_until_done(web, body["id"])
    assert job["state"] == SUCCEEDED
    assert job["result"]["text"] and job["result"]["usage"]["completion_tokens"] > 0
    assert job["result"]["timings"]["ttft_s"] > 0


def test_late_subscriber_gets_every_event_in_order(web, worker, store):
    job_id = requests.post(f"{web}/jobs", json={"prompt": "Tell me a story", "max_new_tokens": 40}).json()["id"]
    wait_terminal(store, job_id)
    with requests.get(f"{web}/jobs/{job_id}/events", stream=True, timeout=30) as reply:
        events = list(iter_sse(reply))
    seqs = [e.id for e in events]
    assert seqs == list(range(1, len(events) + 1))
    assert events[-1].type == "done" and [e.type for e in events].count("done") == 1
    text = "".join(e.data["data"]["text"] for e in events if e.type == "token")
    assert text == store.get(job_id).result["text"]


def test_last_event_id_resumes_without_duplicates(web, worker, store):
    job_id = requests.post(f"{web}/jobs", json={"prompt": "Count with me", "max_new_tokens": 30}).json()["id"]
    wait_terminal(store, job_id)
    with requests.get(f"{web}/jobs/{job_id}/events", stream=True, timeout=30) as reply:
        all_events = list(iter_sse(reply))
    cut = len(all_events) // 2
    with requests.get(f"{web}/jobs/{job_id}/events", stream=True, timeout=30,
                      headers={"Last-Event-ID": str(all_events[cut - 1].id)}) as reply:
        rest = list(iter_sse(reply))
    assert [e.id for e in rest] == [e.id for e in all_events[cut:]]


def test_live_follow_while_running(web, worker, store):
    trace = submit_and_follow(web, {"prompt": "Write a long poem", "max_new_tokens": 200})
    assert trace.terminal == "done"
    assert trace.text == store.get(trace.job_id).result["text"]
    assert trace.seqs == sorted(set(trace.seqs))


def test_cancel_running_job_over_http(web, worker, store):
    with StepGate.on(store).closed(steps=3):  # running when the cancel comes
        job_id = requests.post(f"{web}/jobs", json={"prompt": "Go on forever", "max_new_tokens": 2000}).json()["id"]
        sleep_until_tokens(store, job_id, 1)  # the first chunk goes out at once
        assert requests.post(f"{web}/jobs/{job_id}/cancel").status_code in (200, 202)
    assert wait_terminal(store, job_id, 30).state == CANCELLED


def test_invalid_input_gets_422_and_creates_no_job(web, worker, store):
    before = store.client.zcard(keys.JOBS_INDEX)
    for body in ({"prompt": "x", "max_new_tokens": -1}, {"prompt": "x", "temperature": "hot"},
                 {"prompt": "x", "surprise": 1}, {"messages": []}, {}):
        reply = requests.post(f"{web}/jobs", json=body)
        assert reply.status_code == 422, body
        assert reply.json()["error"]["code"]
    assert store.client.zcard(keys.JOBS_INDEX) == before
    assert requests.get(f"{web}/jobs/does-not-exist").status_code == 404


def test_generate_compat_endpoint_waits_and_answers(web, worker):
    reply = requests.post(f"{web}/generate", json={"prompt": "Hi", "max_new_tokens": 8,
                                                   "generation_method": "official"}, timeout=60)
    assert reply.status_code == 200
    body = reply.json()
    assert body["generation_method"] == "official" and body["finish_reason"] in ("stop", "length")


def test_health_reports_worker(web, worker):
    body = requests.get(f"{web}/healthz").json()
    assert body["redis"] is True and body["workers"] >= 1
    ready = requests.get(f"{web}/health")  # the real worker's heartbeat says its model is loaded
    assert ready.status_code == 200 and ready.json()["ready_workers"] >= 1


def test_agent_job_ends_with_its_trace(web, worker, store):
    reply = requests.post(f"{web}/jobs", json={"type": "agent", "prompt": "What is (48 + 12) / 5?",
                                               "max_steps": 2, "max_new_tokens": 24})
    assert reply.status_code == 202
    record = wait_terminal(store, reply.json()["id"], 90)
    payload = record.result if record.state == SUCCEEDED else record.error
    assert record.state in (SUCCEEDED, "failed"), record.error
    assert isinstance(payload["trace"], list)
    steps = [e for e in store.events(record.id) if e.type == "tool_step"]
    assert len(steps) == len(payload["trace"])
    if record.state == SUCCEEDED:
        assert payload["steps"] == len(payload["trace"])
        assert "".join(e.data["text"] for e in store.events(record.id) if e.type == "token") == payload["text"]
    else:
        assert payload["code"] in ("malformed_tool_call", "max_steps_exceeded")


def test_agent_run_compat_endpoint(web, worker):
    reply = requests.post(f"{web}/agent/run", json={"prompt": "Compute 125 * 8 - 37", "max_steps": 2,
                                                    "max_new_tokens": 24}, timeout=120)
    assert reply.status_code in (200, 422), reply.text
    body = reply.json()
    assert isinstance(body["trace"], list)
