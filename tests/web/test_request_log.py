"""Request logs are JSON events with method, path, status, latency and job id; never bodies."""
from __future__ import annotations

import json
import logging

from core.logs import JsonFormatter
from tests.web.conftest import run_job

SECRET_PROMPT = "purple-elephant-7731"
SECRET_ANSWER = "Hello wörld"


def test_request_log_events_carry_ids_and_latency_but_no_text(client, celery, store, caplog):
    caplog.set_level(logging.INFO)
    celery.runner = lambda job_id: run_job(store, job_id)
    job_id = client.post("/jobs", json={"prompt": SECRET_PROMPT}).get_json()["id"]
    client.get(f"/jobs/{job_id}")
    client.get(f"/jobs/{job_id}/events").get_data()
    client.post("/generate", json={"prompt": SECRET_PROMPT})
    client.post("/jobs", json={"prompt": SECRET_PROMPT, "bogus": SECRET_PROMPT})
    lines = [JsonFormatter().format(record) for record in caplog.records]
    assert not [line for line in lines if SECRET_PROMPT in line or "wörld" in line]
    http = [json.loads(line) for line in lines if '"http_request"' in line]
    assert [(e["method"], e["path"], e["status"]) for e in http] == [
        ("POST", "/jobs", 202), ("GET", f"/jobs/{job_id}", 200), ("GET", f"/jobs/{job_id}/events", 200),
        ("POST", "/generate", 200), ("POST", "/jobs", 422)]
    assert all(isinstance(e["latency_ms"], float) for e in http)
    assert [e["job_id"] for e in http[:3]] == [job_id] * 3 and http[3]["job_id"] and http[4]["job_id"] is None
    sse_closed = [json.loads(line) for line in lines if '"sse_closed"' in line]
    assert sse_closed and sse_closed[0]["events"] == 5
