"""Hostile inputs on the real web server (``python -m web``, gunicorn) and real Redis
(issue 15, items 4 and 5): deep JSON is a 400 on every endpoint; an out-of-range
``Last-Event-ID`` / ``?after=`` is a 400 before the stream starts, for a running and a
finished job (with real Redis, 2^64 used to answer 200 and then drop the connection)."""
from __future__ import annotations

import pytest
import requests

from core.events import SUCCEEDED
from tests.integration.conftest import started_web

pytestmark = pytest.mark.integration
DEEP = '{"prompt": ' + "[" * 1000 + "]" * 1000 + "}"
POST_PATHS = ("/jobs", "/generate", "/agent/run", "/bench", "/v1/chat/completions", "/jobs/abc/cancel")


@pytest.fixture(scope="module")
def web_only(shared_stack):
    proc, base = started_web(shared_stack, MINISERVE_WEB_WORKERS="1")
    yield base, proc
    proc.kill()  # teardown: no graceful stop is under test here


def test_deep_json_is_400_everywhere(web_only):
    base, proc = web_only
    for path in POST_PATHS:
        reply = requests.post(f"{base}{path}", data=DEEP, headers={"Content-Type": "application/json"}, timeout=10)
        assert reply.status_code == 400, (path, reply.status_code, reply.text[:300])
        assert reply.json()["error"]["code"] == "json_too_deep"
    args = "[" * 1000 + "]" * 1000
    reply = requests.post(f"{base}/v1/chat/completions", timeout=10, json={"messages": [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}]},
        {"role": "user", "content": "next"}]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "messages[0].tool_calls[0].function.arguments"
    assert "Traceback" not in proc.log()


def test_out_of_range_event_ids_are_400_on_running_and_finished_jobs(web_only, shared_store):
    base, _ = web_only
    running = shared_store.create("generate", "generation", {"messages": []})
    shared_store.start_attempt(running.id, "test-worker", lease_s=60)
    finished = shared_store.create("generate", "generation", {"messages": []})
    attempt = shared_store.start_attempt(finished.id, "test-worker", lease_s=60).attempt
    shared_store.finish(finished.id, SUCCEEDED, {"text": ""}, attempt=attempt)
    for job in (running, finished):
        for value in (str(2**64), str(2**63), "1" * 30):
            header = requests.get(f"{base}/jobs/{job.id}/events", headers={"Last-Event-ID": value}, timeout=10)
            query = requests.get(f"{base}/jobs/{job.id}/events?after={value}", timeout=10)
            for reply, field in ((header, "Last-Event-ID"), (query, "after")):
                assert reply.status_code == 400, (value, reply.status_code, reply.text[:200])
                assert reply.json()["error"] == reply.json()["error"] | {"code": "bad_last_event_id", "field": field}
    # The largest valid seq still streams (and ends at once for the finished job).
    reply = requests.get(f"{base}/jobs/{finished.id}/events", headers={"Last-Event-ID": str(2**63 - 1)}, timeout=10)
    assert reply.status_code == 200 and "event:" not in reply.text
