"""The per-request ``speculative`` flag on /jobs, /generate and /v1/chat/completions: stored
for the worker when given, a 422 naming the field when not a boolean; the worker reads it."""
from __future__ import annotations

import pytest

from tests.web.conftest import FakeCelery, client, make_app, redis_client, store  # noqa: F401
from worker.job_runner import BadJobRequest
from worker.requests import generation_request_from


@pytest.fixture
def celery():
    return FakeCelery()


@pytest.mark.parametrize("flag", [True, False])
def test_jobs_and_chat_store_the_flag(client, store, flag):  # noqa: F811
    job = client.post("/jobs", json={"prompt": "hi", "speculative": flag}).get_json()
    assert store.get(job["id"]).request["speculative"] is flag
    chat = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "speculative": flag, "stream": True})
    assert store.get(chat.headers["X-Job-Id"]).request["speculative"] is flag
    plain = client.post("/jobs", json={"prompt": "hi"}).get_json()
    assert "speculative" not in store.get(plain["id"]).request


@pytest.mark.parametrize("path,body", [
    ("/jobs", {"prompt": "hi", "speculative": "yes"}),
    ("/jobs", {"prompt": "hi", "speculative": 1}),
    ("/generate", {"prompt": "hi", "speculative": "true"}),
])
def test_non_boolean_flag_is_a_422_naming_it(client, celery, path, body):  # noqa: F811
    response = client.post(path, json=body)
    assert response.status_code == 422, response.get_json()
    assert response.get_json()["error"]["field"] == "speculative"
    assert celery.sent == []


def test_chat_rejects_a_non_boolean_flag(client, celery):  # noqa: F811
    """The /v1 routes answer OpenAI's way: 400 invalid_request_error naming the param."""
    response = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "speculative": "on"})
    assert response.status_code == 400
    assert response.get_json()["error"]["param"] == "speculative"
    assert celery.sent == []


def test_worker_turns_the_stored_flag_into_the_request():
    stored = {"messages": [{"role": "user", "content": "x"}], "speculative": False}
    assert generation_request_from(stored, 8).speculative is False
    assert generation_request_from({"prompt": "x"}, 8).speculative is None
    with pytest.raises(BadJobRequest):
        generation_request_from({"prompt": "x", "speculative": "no"}, 8)


def test_draft_counts_reach_usage_metrics_and_the_monitor(client, store):  # noqa: F811
    from core.workers import write_heartbeat
    from tests.web.conftest import run_job
    from web.openai.responses import usage

    job = client.post("/jobs", json={"prompt": "hi"}).get_json()
    payload = {"text": "ab", "finish_reason": "length", "method": "custom_cache",
               "usage": {"prompt_tokens": 5, "completion_tokens": 9, "cached_tokens": 0,
                         "draft_tokens": 8, "accepted_draft_tokens": 6},
               "timings": {"ttft_s": 0.01, "total_s": 0.02, "decode_tokens_per_s": 100.0}}
    run_job(store, job["id"], payload=payload)
    write_heartbeat(store.client, "w1", {"cache_stats": {
        "speculative": {"requests": 1, "draft_tokens": 8, "accepted_draft_tokens": 6, "acceptance_rate": 0.75},
        "paged": {"running": 0, "draft_tokens": 12, "accepted_draft_tokens": 3}}}, ttl_s=30)
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'miniserve_speculative_draft_tokens_total{type="generate"} 8.0' in metrics
    assert 'miniserve_speculative_accepted_tokens_total{type="generate"} 6.0' in metrics
    assert 'miniserve_worker_speculative_draft_tokens_total{worker="w1"} 20.0' in metrics
    assert 'miniserve_worker_speculative_accepted_tokens_total{worker="w1"} 9.0' in metrics
    row = next(r for r in client.get("/overview").get_json()["jobs"] if r["id"] == job["id"])
    assert row["usage"]["draft_tokens"] == 8 and row["usage"]["accepted_draft_tokens"] == 6
    assert usage(payload)["completion_tokens_details"] == {"accepted_prediction_tokens": 6,
                                                           "rejected_prediction_tokens": 2}
