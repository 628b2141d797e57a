"""``POST /generate`` and ``POST /agent/run``: the original MiniServe shapes, answered by
waiting on the job (the fake Celery client plays the worker)."""
from __future__ import annotations

from core import keys
from core.events import FAILED, MAX_STEPS_EXCEEDED, TIMEOUT
from tests.web.conftest import parse_sse, run_job


def test_generate_waits_and_answers_the_original_shape(client, celery, store):
    celery.runner = lambda job_id: run_job(store, job_id)
    response = client.post("/generate", json={"prompt": "hi", "prefix": "You teach ML.", "max_new_tokens": 16,
                                              "temperature": 0, "top_p": 0.9, "generation_method": "prefix_cache"})
    assert response.status_code == 200
    body = response.get_json()
    assert body["text"] == "Hello wörld" and body["finish_reason"] == "length"
    assert body["generation_method"] == "official"  # what the worker reported it ran
    assert body["usage"]["completion_tokens"] == 3 and body["timings"]["ttft_s"] == 0.01
    job = store.get(body["job_id"])
    assert job.request["method"] == "prefix_cache" and job.request["prefix"] == "You teach ML."
    assert job.request["sampling"]["top_p"] == 0.9


def test_generate_follows_a_job_that_runs_later(client, celery, store):
    celery.runner, celery.threaded = (lambda job_id: run_job(store, job_id, delay_s=0.2)), True
    response = client.post("/generate", json={"prompt": "hi"})
    assert response.status_code == 200 and response.get_json()["text"] == "Hello wörld"


def test_generate_stream_answers_sse_of_the_job(client, celery, store):
    celery.runner, celery.threaded = (lambda job_id: run_job(store, job_id, delay_s=0.1)), True
    response = client.post("/generate", json={"prompt": "hi", "stream": True})
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    frames = parse_sse(response.get_data(as_text=True))
    assert [f["event"] for f in frames] == ["state", "token", "token", "token", "done"]
    assert response.headers["X-Job-Id"] == celery.sent[0]["task_id"]


def test_generate_timeout_is_504_with_the_job_id(make_app, celery):
    client = make_app(wait_timeout_s=1).test_client()
    response = client.post("/generate", json={"prompt": "hi"})
    assert response.status_code == 504
    error = response.get_json()["error"]
    assert error["code"] == "wait_timeout" and error["job_id"] == celery.sent[0]["task_id"]


def test_generate_failed_job_is_a_json_500_naming_the_job(client, celery, store):
    celery.runner = lambda job_id: run_job(store, job_id, state=FAILED,
                                           payload={"code": "engine_error", "message": "boom"})
    response = client.post("/generate", json={"prompt": "hi"})
    assert response.status_code == 500 and response.is_json
    assert response.get_json()["error"]["code"] == "engine_error"


def test_generate_soft_time_limit_is_504(client, celery, store):
    celery.runner = lambda job_id: run_job(store, job_id, state=TIMEOUT, payload={"message": "soft time limit"})
    response = client.post("/generate", json={"prompt": "hi"})
    assert response.status_code == 504 and response.get_json()["error"]["code"] == "job_timeout"


def test_generate_validates_like_jobs(client, celery, store):
    response = client.post("/generate", json={"prompt": "hi", "max_new_tokens": "many"})
    assert response.status_code == 422 and response.get_json()["error"]["field"] == "max_new_tokens"
    assert client.post("/generate", json={"prefix": "p"}).get_json()["error"]["field"] == "prompt"
    assert celery.sent == [] and store.client.zcard(keys.JOBS_INDEX) == 0


AGENT_RESULT = {"text": "The result is 963.", "steps": 1, "trace": [
    {"step": 1, "model_tool_name": "calculator", "tool_name": "calculator",
     "arguments": {"expression": "125 * 8 - 37"}, "result": "963", "success": True}]}


def test_agent_run_answers_text_steps_and_trace(client, celery, store):
    celery.runner = lambda job_id: run_job(store, job_id, chunks=(), payload=AGENT_RESULT)
    response = client.post("/agent/run", json={"prompt": "(125 * 8) - 37?", "max_steps": 3, "max_new_tokens": 64})
    assert response.status_code == 200
    body = response.get_json()
    assert {k: body[k] for k in ("text", "steps", "trace")} == AGENT_RESULT
    job = store.get(body["job_id"])
    assert job.type == "agent" and job.request["max_steps"] == 3
    assert job.request["sampling"]["max_new_tokens"] == 64
    assert celery.sent[0]["queue"] == "agent"


def test_agent_max_steps_exceeded_is_422_with_the_trace(client, celery, store):
    payload = {"code": MAX_STEPS_EXCEEDED, "message": "no answer after 1 steps", "trace": AGENT_RESULT["trace"]}
    celery.runner = lambda job_id: run_job(store, job_id, chunks=(), state=FAILED, payload=payload)
    response = client.post("/agent/run", json={"prompt": "loop", "max_steps": 1})
    assert response.status_code == 422
    body = response.get_json()
    assert body["error"]["code"] == MAX_STEPS_EXCEEDED and body["trace"] == AGENT_RESULT["trace"]


def test_agent_body_is_strict(client, celery):
    assert client.post("/agent/run", json={"prompt": "x", "max_steps": 0}).status_code == 422
    assert client.post("/agent/run", json={"prompt": "x", "tools": []}).get_json()["error"]["field"] == "tools"
    assert celery.sent == []
