"""The per-client limit on open SSE streams: per address, per API key, counted in Redis,
freed when the response closes, and never held by a dead process past its lease."""
from __future__ import annotations

import time

from core import keys, limits
from web import stream_limit
from web.guards import owner_id

KEY_A, KEY_B = "key-a", "key-b"


def running_job(store, owner: str = "") -> str:
    job = store.create("generation", "generation", {"prompt": "hi"}, owner=owner)
    store.start_attempt(job.id, "w", lease_s=30)
    return job.id


def open_stream(client, job_id: str, key: str | None = None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return client.get(f"/jobs/{job_id}/events", headers=headers, buffered=False)


def test_one_stream_over_the_limit_is_429_json_and_a_closed_one_frees_its_slot(make_app, store):
    client = make_app(max_streams_per_client=2).test_client()
    job_id = running_job(store)
    first, second = open_stream(client, job_id), open_stream(client, job_id)
    assert first.status_code == second.status_code == 200
    refused = open_stream(client, job_id)
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
    error = refused.get_json()["error"]
    assert error["code"] == "too_many_streams" and "address" in error["message"]
    second.close()  # (the test client keeps each open stream's context pushed: close the last first)
    assert open_stream(client, job_id).status_code == 200
    assert store.client.zcard(keys.streams_key("ip:127.0.0.1")) == 2


def test_each_key_and_each_address_has_its_own_limit(make_app, store):
    client = make_app(max_streams_per_client=2, api_keys=[KEY_A, KEY_B]).test_client()
    job_a, job_b = running_job(store, owner_id(KEY_A)), running_job(store, owner_id(KEY_B))
    held = [open_stream(client, job_a, KEY_A), open_stream(client, job_a, KEY_A)]
    assert [r.status_code for r in held] == [200, 200]
    over_key = open_stream(client, job_a, KEY_A)
    assert over_key.status_code == 429 and "API key" in over_key.get_json()["error"]["message"]
    # key B has streams to spare, but this address already holds two
    over_address = open_stream(client, job_b, KEY_B)
    assert over_address.status_code == 429 and "address" in over_address.get_json()["error"]["message"]
    assert store.client.zcard(keys.streams_key(f"key:{owner_id(KEY_B)}")) == 0  # the refusal counted nothing
    held[1].close()
    assert open_stream(client, job_b, KEY_B).status_code == 200


def test_a_refused_streaming_generate_submits_no_job(make_app, store, celery):
    client = make_app(max_streams_per_client=1).test_client()
    assert open_stream(client, running_job(store)).status_code == 200
    before = store.client.zcard(keys.JOBS_INDEX)
    response = client.post("/generate", json={"prompt": "hi", "stream": True}, buffered=False)
    assert response.status_code == 429 and response.get_json()["error"]["code"] == "too_many_streams"
    chat = client.post("/v1/chat/completions", buffered=False,
                       json={"messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert chat.status_code == 429
    assert celery.sent == [] and store.client.zcard(keys.JOBS_INDEX) == before


def test_a_dead_process_leaves_nothing_past_its_lease(make_app, store):
    client = make_app(max_streams_per_client=1).test_client()
    store.client.zadd(keys.streams_key("ip:127.0.0.1"), {"left-by-a-killed-web": time.time() - 1})
    assert open_stream(client, running_job(store)).status_code == 200


def test_zero_means_unlimited(make_app, store):
    client = make_app(max_streams_per_client=0).test_client()
    job_id = running_job(store)
    assert all(open_stream(client, job_id).status_code == 200 for _ in range(5))
    assert store.client.zcard(keys.streams_key("ip:127.0.0.1")) == 0


def test_one_pipeline_renews_every_open_stream_of_the_process(make_app, store, monkeypatch):
    app = make_app(max_streams_per_client=10)
    client = app.test_client()
    job_id = running_job(store)
    streams = [open_stream(client, job_id) for _ in range(3)]
    members = store.client.zrange(keys.streams_key("ip:127.0.0.1"), 0, -1, withscores=True)
    renewer = app.extensions[stream_limit.RENEWER_KEY]
    assert len(members) == 3 and set(renewer.slots) == {token for token, _ in members}
    calls = []
    monkeypatch.setattr(stream_limit, "renew_streams", lambda *args: calls.append(args) or real(*args))
    real = limits.renew_streams
    time.sleep(0.01)
    assert renewer.renew_now() == 3 and len(calls) == 1  # one call, one pipeline, for all three
    renewed = dict(store.client.zrange(keys.streams_key("ip:127.0.0.1"), 0, -1, withscores=True))
    assert all(renewed[token] > deadline for token, deadline in members)
    streams[-1].close()
    assert len(renewer.slots) == 2 and renewer.renew_now() == 2
    assert store.client.zcard(keys.streams_key("ip:127.0.0.1")) == 2  # XX: a closed stream is not re-added
