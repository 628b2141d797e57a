"""Logs on the real stack (issue 8, item 4): web and worker logs are JSON events and never
carry prompt or answer text, whatever path the text took (job, SSE, /generate, the
OpenAI-compatible chat route, a rejected body, an agent run)."""
from __future__ import annotations

import json

import pytest
import requests

from core.events import SUCCEEDED
from tests.harness.client import iter_sse
from tests.integration.conftest import started_workers_and_web, wait_terminal

pytestmark = pytest.mark.integration
SECRET = "zebra-quokka-8812"
PROMPT = f"Please remember the passphrase {SECRET} and tell me a story"
# Plain-text lines Celery prints itself (not through logging): its start-up banner and the
# shutdown notice. Everything else must be JSON.
CELERY_PRINTS = ("worker: Warm shutdown", "worker: Cold shutdown")


def json_events(log: str, name: str) -> list[dict]:
    """Every line after the first JSON line must be a JSON event (Celery's banner comes first)."""
    lines = log.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("{"))
    events = []
    for line in lines[first:]:
        if not line.strip() or line.startswith(CELERY_PRINTS):
            continue
        event = json.loads(line)  # raises on a line that is not JSON
        assert isinstance(event.get("event"), str) and event["event"], f"{name}: {line}"
        assert {"ts", "level", "logger"} <= event.keys(), f"{name}: {line}"
        events.append(event)
    return events


def test_logs_are_json_events_without_prompt_or_answer_text(stack, store):
    (worker,), web_proc, base = started_workers_and_web(stack, store, {}, MINISERVE_WEB_WORKERS="1")
    try:
        job_id = requests.post(f"{base}/jobs", json={"prompt": PROMPT, "max_new_tokens": 24}, timeout=10).json()["id"]
        record = wait_terminal(store, job_id, 60)
        assert record.state == SUCCEEDED
        with requests.get(f"{base}/jobs/{job_id}/events", stream=True, timeout=30) as reply:
            streamed = "".join(e.data["data"]["text"] for e in iter_sse(reply) if e.type == "token")
        assert requests.get(f"{base}/jobs/{job_id}", timeout=10).status_code == 200
        generated = requests.post(f"{base}/generate", json={"prompt": PROMPT, "max_new_tokens": 16},
                                  timeout=60).json()["text"]
        chat = requests.post(f"{base}/v1/chat/completions", timeout=60, json={
            "max_tokens": 16, "messages": [{"role": "user", "content": PROMPT}]})
        assert chat.status_code == 200, chat.text
        chat_text = chat.json()["choices"][0]["message"]["content"]
        rejected = requests.post(f"{base}/jobs", json={"prompt": PROMPT, "temperature": SECRET}, timeout=10)
        assert rejected.status_code == 422
        agent = requests.post(f"{base}/jobs", json={"type": "agent", "prompt": f"{SECRET}: what is 6 * 7?",
                                                    "max_steps": 1, "max_new_tokens": 16}, timeout=10).json()["id"]
        wait_terminal(store, agent, 90)
    finally:
        web_proc.stop()
        worker.stop()

    answer = record.result["text"]
    assert streamed == answer and len(answer) >= 12  # long enough that finding it would mean a leak
    logs = {"web": web_proc.log(), "worker": worker.log()}
    for name, log in logs.items():
        for needle in (SECRET, answer, *(t for t in (generated, chat_text) if len(t) >= 8)):
            assert needle not in log, f"{name} log holds prompt or answer text"
    web_events = {e["event"] for e in json_events(logs["web"], "web")}
    worker_events = {e["event"] for e in json_events(logs["worker"], "worker")}
    assert {"http_request", "sse_closed"} <= web_events
    assert {"job_started", "job_finished", "engine_loaded"} <= worker_events
