"""``/jobs`` routes: submit, read, list, cancel; the stored request shape; nothing enqueued
for a rejected request."""
from __future__ import annotations

import pytest

from core import keys, tasks
from core.events import CANCELLED, RUNNING
from tests.web.conftest import run_job


def test_submit_prompt_answers_202_and_sends_task_by_name(client, celery, store):
    response = client.post("/jobs", json={"prompt": "hi", "max_new_tokens": 7, "stop": "\n"})
    assert response.status_code == 202
    body = response.get_json()
    job_id = body["id"]
    assert body["state"] == "queued"
    assert body["links"] == {"self": f"/jobs/{job_id}", "events": f"/jobs/{job_id}/events",
                             "cancel": f"/jobs/{job_id}/cancel"}
    assert response.headers["Location"] == f"/jobs/{job_id}"
    assert celery.sent == [{"name": tasks.GENERATE, "args": [job_id], "task_id": job_id, "queue": "generation"}]
    request = store.get(job_id).request
    assert request == {
        "messages": [{"role": "user", "content": "hi"}], "prefix": None,
        "sampling": {"max_new_tokens": 7, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                     "repetition_penalty": None, "seed": None, "stop": ["\n"]},
        "method": "paged", "tools": None, "max_steps": None,  # MINISERVE_DEFAULT_GENERATION_METHOD
        "model": "qwen2.5-coder-0.5b-instruct",  # none named: the cluster's default
        "priority": "default"}  # /jobs' default class


def test_submit_messages_with_system_and_prefix_defaults(make_app, store):
    client = make_app(default_max_new_tokens=33).test_client()
    response = client.post("/jobs", json={
        "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                     {"role": "user", "content": "c"}],
        "system": "be brief", "generation_method": "paged", "temperature": 0.7, "top_k": 5, "seed": 3})
    assert response.status_code == 202
    request = store.get(response.get_json()["id"]).request
    assert [m["role"] for m in request["messages"]] == ["system", "user", "assistant", "user"]
    assert request["messages"][0]["content"] == "be brief"
    assert request["method"] == "paged"
    assert request["sampling"]["max_new_tokens"] == 33
    assert request["sampling"]["temperature"] == 0.7 and request["sampling"]["seed"] == 3


def test_tiny_temperature_is_stored_as_greedy(client, store):
    response = client.post("/jobs", json={"prompt": "a", "temperature": 1e-300})
    assert response.status_code == 202
    assert store.get(response.get_json()["id"]).request["sampling"]["temperature"] == 0.0


def test_agent_job_goes_to_agent_queue(client, celery, store):
    response = client.post("/jobs", json={"type": "agent", "prompt": "2+2?", "max_steps": 4, "prefix": "p"})
    assert response.status_code == 202
    job = store.get(response.get_json()["id"])
    assert job.type == "agent" and job.queue == "agent"
    assert job.request["max_steps"] == 4 and job.request["prefix"] == "p"
    assert celery.sent[0]["name"] == tasks.AGENT and celery.sent[0]["queue"] == "agent"


@pytest.mark.parametrize("body, field", [
    ({}, "prompt"),
    ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
    ({"prompt": "a", "max_tokens": 5}, "max_tokens"),
    ({"prompt": "a", "temperature": -1}, "temperature"),
    ({"prompt": "a", "temperature": 1, "repetition_penalty": 1e-308}, "repetition_penalty"),
    ({"prompt": "a", "top_p": 0}, "top_p"),
    ({"prompt": "a", "max_new_tokens": 0}, "max_new_tokens"),
    ({"prompt": "a", "max_new_tokens": 999999}, "max_new_tokens"),
    ({"prompt": "a", "generation_method": "fast"}, "generation_method"),
    ({"prompt": "a", "type": "bench"}, "type"),
    ({"prompt": "a", "prefix": "x", "system": "y"}, "system"),
    ({"prompt": "a", "max_steps": 2}, "max_steps"),
    ({"type": "agent", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
    ({"messages": [{"role": "robot", "content": "b"}]}, "messages.0.role"),
    ({"messages": []}, "messages"),
    ({"prompt": "a", "stop": ["x"] * 9}, "stop"),
    ({"prompt": 5}, "prompt"),
])
def test_invalid_body_is_422_naming_the_field_and_enqueues_nothing(client, celery, store, body, field):
    response = client.post("/jobs", json=body)
    assert response.status_code == 422, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "validation_error"
    assert error["field"] == field, error
    assert celery.sent == [] and store.client.zcard(keys.JOBS_INDEX) == 0


def test_malformed_json_is_400(client, celery):
    response = client.post("/jobs", data="{prompt: hi", content_type="application/json")
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "malformed_json"
    assert celery.sent == []


def test_wrong_content_type_is_415(client, celery):
    response = client.post("/jobs", data="prompt=hi", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert response.get_json()["error"]["code"] == "unsupported_media_type"
    assert celery.sent == []


def test_oversized_body_is_413(make_app, celery):
    client = make_app(max_body_bytes=1000).test_client()
    response = client.post("/jobs", json={"prompt": "x" * 2000})
    assert response.status_code == 413
    assert response.get_json()["error"]["code"] == "body_too_large"
    assert celery.sent == []


def test_missing_body_is_422(client, celery):
    response = client.post("/jobs")
    assert response.status_code == 422
    assert celery.sent == []


@pytest.mark.parametrize("method, path", [
    ("get", "/jobs/nope"), ("post", "/jobs/nope/cancel"), ("get", "/jobs/nope/events")])
def test_unknown_job_is_404_json(client, method, path):
    response = getattr(client, method)(path)
    assert response.status_code == 404
    assert response.get_json()["error"] == {"code": "job_not_found", "message": "no job 'nope'", "job_id": "nope"}


def test_unknown_route_and_method_are_json(client):
    assert client.get("/nowhere").get_json()["error"]["code"] == "not_found"
    response = client.delete("/jobs")
    assert response.status_code == 405 and response.get_json()["error"]["code"] == "method_not_allowed"


def test_get_finished_job_has_result_usage_and_timings(client, store):
    job_id = client.post("/jobs", json={"prompt": "hi"}).get_json()["id"]
    run_job(store, job_id)
    body = client.get(f"/jobs/{job_id}").get_json()
    assert body["state"] == "succeeded" and body["attempt"] == 1
    assert body["result"]["text"] == "Hello wörld"
    assert body["usage"]["completion_tokens"] == 3
    assert body["timings"]["ttft_s"] == 0.01
    assert body["timings"]["queue_wait_s"] >= 0 and body["timings"]["job_total_s"] >= 0
    assert "owner" not in body and body["error"] is None


def test_list_filters_by_state_and_type(client, store):
    ids = [client.post("/jobs", json={"prompt": str(i)}).get_json()["id"] for i in range(3)]
    agent_id = client.post("/jobs", json={"type": "agent", "prompt": "x"}).get_json()["id"]
    run_job(store, ids[0])
    listed = client.get("/jobs").get_json()["jobs"]
    assert [j["id"] for j in listed] == [agent_id, *reversed(ids)]
    assert [j["id"] for j in client.get("/jobs?state=succeeded").get_json()["jobs"]] == [ids[0]]
    assert [j["id"] for j in client.get("/jobs?type=agent").get_json()["jobs"]] == [agent_id]
    assert len(client.get("/jobs?limit=2").get_json()["jobs"]) == 2
    bad = client.get("/jobs?state=sleeping")
    assert bad.status_code == 422 and bad.get_json()["error"]["field"] == "state"
    assert client.get("/jobs?limit=0").status_code == 422


def test_cancel_queued_job_revokes_the_task(client, celery, store):
    job_id = client.post("/jobs", json={"prompt": "hi"}).get_json()["id"]
    response = client.post(f"/jobs/{job_id}/cancel")
    assert response.status_code == 200
    assert response.get_json()["state"] == CANCELLED
    assert celery.control.revoked == [job_id]
    assert [e.type for e in store.events(job_id)] == ["cancelled"]


def test_cancel_running_job_raises_the_flag_only(client, celery, store):
    job_id = client.post("/jobs", json={"prompt": "hi"}).get_json()["id"]
    store.start_attempt(job_id, "w", lease_s=30)
    response = client.post(f"/jobs/{job_id}/cancel")
    assert response.status_code == 200 and response.get_json()["state"] == RUNNING
    assert store.cancel_requested(job_id)
    assert celery.control.revoked == []


def test_cancel_finished_job_changes_nothing(client, store):
    job_id = client.post("/jobs", json={"prompt": "hi"}).get_json()["id"]
    run_job(store, job_id)
    response = client.post(f"/jobs/{job_id}/cancel")
    assert response.get_json()["state"] == "succeeded"
    assert not store.cancel_requested(job_id)
