"""Issue 8 item 3: API keys, owners, rate limits, back-pressure and idempotency."""
from __future__ import annotations

from core import keys
from tests.web.conftest import run_job
from web.guards import owner_id

KEY_A, KEY_B = "key-a-secret", "key-b-secret"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}


def test_keys_required_everywhere_but_healthz_and_docs(make_app, celery):
    client = make_app(api_keys=[KEY_A, KEY_B]).test_client()
    for method, path in [("post", "/jobs"), ("get", "/jobs"), ("get", "/jobs/x"), ("post", "/jobs/x/cancel"),
                         ("get", "/jobs/x/events"), ("post", "/generate"), ("post", "/agent/run"),
                         ("get", "/workers"), ("get", "/queues")]:
        response = getattr(client, method)(path, json={"prompt": "hi"} if method == "post" else None)
        assert response.status_code == 401, path
        assert response.get_json()["error"]["code"] == "unauthorized"
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert client.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/jobs", headers={"Authorization": KEY_A}).status_code == 401  # no scheme
    assert client.get("/healthz").status_code == 200
    assert client.get("/openapi.json").status_code == 200 and client.get("/docs").status_code == 200
    assert celery.sent == []


def test_jobs_are_visible_and_cancellable_only_by_their_key(make_app, store):
    client = make_app(api_keys=[KEY_A, KEY_B]).test_client()
    job_id = client.post("/jobs", json={"prompt": "hi"}, headers=A).get_json()["id"]
    stored = store.client.hgetall(keys.job_key(job_id))
    assert stored["owner"] == owner_id(KEY_A) and KEY_A not in str(stored)
    assert client.get(f"/jobs/{job_id}", headers=A).status_code == 200
    assert client.get(f"/jobs/{job_id}", headers=B).status_code == 404
    assert client.get(f"/jobs/{job_id}/events", headers=B).status_code == 404
    assert client.post(f"/jobs/{job_id}/cancel", headers=B).status_code == 404
    assert store.get(job_id).state == "queued"
    assert [j["id"] for j in client.get("/jobs", headers=A).get_json()["jobs"]] == [job_id]
    assert client.get("/jobs", headers=B).get_json()["jobs"] == []
    assert client.post(f"/jobs/{job_id}/cancel", headers=A).get_json()["state"] == "cancelled"


def test_openapi_document_declares_bearer_security_when_keys_are_set(make_app):
    spec = make_app(api_keys=[KEY_A]).test_client().get("/openapi.json").get_json()
    assert spec["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert spec["components"]["securitySchemes"]["x_api_key"] == {"type": "apiKey", "in": "header",
                                                                  "name": "x-api-key"}
    assert spec["security"] == [{"bearer": []}, {"x_api_key": []}]
    assert spec["paths"]["/healthz"]["get"]["security"] == []
    open_spec = make_app().test_client().get("/openapi.json").get_json()
    assert "security" not in open_spec


def test_rate_limit_per_key_is_429_with_retry_after(make_app):
    client = make_app(api_keys=[KEY_A, KEY_B], rate_limit_per_minute=3).test_client()
    statuses = [client.get("/queues", headers=A).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    limited = client.get("/queues", headers=A)
    assert limited.get_json()["error"]["code"] == "rate_limited"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert client.get("/queues", headers=B).status_code == 200  # another key has its own budget
    assert client.get("/healthz").status_code == 200


def test_rate_limit_without_keys_counts_per_client_address(make_app):
    client = make_app(rate_limit_per_minute=2).test_client()
    assert [client.get("/queues").status_code for _ in range(3)] == [200, 200, 429]


def test_full_queue_is_503_with_retry_after_and_enqueues_nothing(make_app, celery, store):
    client = make_app(max_queue_depth=2).test_client()
    store.client.rpush(keys.queue_key("generation"), "m1", "m2")
    response = client.post("/jobs", json={"prompt": "hi"})
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "queue_full"
    assert response.headers["Retry-After"] == "5"
    assert celery.sent == [] and store.client.zcard(keys.JOBS_INDEX) == 0
    assert client.post("/jobs", json={"type": "agent", "prompt": "hi"}).status_code == 202  # other queue


def test_idempotency_key_returns_the_same_job(client, celery, store):
    first = client.post("/jobs", json={"prompt": "hi"}, headers={"Idempotency-Key": "abc"})
    again = client.post("/jobs", json={"prompt": "hi"}, headers={"Idempotency-Key": "abc"})
    other = client.post("/jobs", json={"prompt": "hi"}, headers={"Idempotency-Key": "xyz"})
    assert first.status_code == again.status_code == 202
    assert first.get_json()["id"] == again.get_json()["id"] != other.get_json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert len(celery.sent) == 2 and store.client.zcard(keys.JOBS_INDEX) == 2


def test_idempotency_keys_are_per_owner(make_app, celery):
    client = make_app(api_keys=[KEY_A, KEY_B]).test_client()
    a = client.post("/jobs", json={"prompt": "hi"}, headers={**A, "Idempotency-Key": "k"}).get_json()["id"]
    b = client.post("/jobs", json={"prompt": "hi"}, headers={**B, "Idempotency-Key": "k"}).get_json()["id"]
    assert a != b and len(celery.sent) == 2


def test_rejected_submission_does_not_hold_its_idempotency_key(make_app, celery, store):
    client = make_app(max_queue_depth=1).test_client()
    store.client.rpush(keys.queue_key("generation"), "m1")
    assert client.post("/jobs", json={"prompt": "hi"}, headers={"Idempotency-Key": "r"}).status_code == 503
    store.client.delete(keys.queue_key("generation"))
    response = client.post("/jobs", json={"prompt": "hi"}, headers={"Idempotency-Key": "r"})
    assert response.status_code == 202 and "Idempotent-Replayed" not in response.headers
    assert len(celery.sent) == 1


def test_extensions_can_open_a_path_prefix_without_a_key(make_app):
    from web.guards import add_public_prefix
    app = make_app(api_keys=[KEY_A])
    add_public_prefix(app, "/monitor-assets/")
    client = app.test_client()
    assert client.get("/monitor-assets/app.js").status_code == 404  # reached routing, not 401
    assert client.get("/not-opened").status_code == 401


def test_workers_hide_hosts_paths_and_jobs_from_keys_that_are_not_admin(make_app, redis_client):
    from core.workers import write_heartbeat
    admin = "admin-key-secret"
    client = make_app(api_keys=[KEY_A], admin_api_keys=[admin]).test_client()
    write_heartbeat(redis_client, "celery@secret-host", {
        "host": "secret-host", "pid": 4242, "node": "celery@secret-host", "queue": "worker.celery@secret-host",
        "model": "/srv/models/private.gguf", "path": "/srv/models/prepared", "model_id": "private",
        "current_jobs": ["job-of-another-key"], "concurrency": 8, "engine_loaded": True})
    for path in ("/workers", "/overview"):
        seen = client.get(path, headers=A).get_json()["workers"]
        text = str(seen)
        assert "secret-host" not in text and "/srv/models" not in text and "4242" not in text
        assert "job-of-another-key" not in text
        assert seen[0]["info"]["running_jobs"] == 1 and seen[0]["info"]["model_id"] == "private"
        full = client.get(path, headers={"Authorization": f"Bearer {admin}"}).get_json()["workers"]
        assert full[0]["name"] == "celery@secret-host" and full[0]["info"]["pid"] == 4242
    # one key for everybody (no keys configured) is everybody's admin, as before
    open_client = make_app().test_client()
    assert open_client.get("/workers").get_json()["workers"][0]["info"]["host"] == "secret-host"


def test_each_key_s_jobs_carry_its_own_cache_scope_unless_the_cache_is_shared(make_app, store):
    """The prefix-cache salt a worker hashes prompt blocks with (core/prefix_hash.py)."""
    client = make_app(api_keys=[KEY_A, KEY_B]).test_client()
    scopes = [store.get(client.post("/jobs", json={"prompt": "hi"}, headers=h).get_json()["id"]).request.get("cache_scope")
              for h in (A, B, A)]
    assert scopes[0] == scopes[2] == owner_id(KEY_A) and scopes[1] == owner_id(KEY_B)
    shared = make_app(api_keys=[KEY_A, KEY_B], share_prefix_cache_across_keys=True).test_client()
    job_id = shared.post("/jobs", json={"prompt": "hi"}, headers=A).get_json()["id"]
    assert "cache_scope" not in store.get(job_id).request
    open_id = make_app().test_client().post("/jobs", json={"prompt": "hi"}).get_json()["id"]
    assert "cache_scope" not in store.get(open_id).request   # no keys: everyone is one key


def test_a_request_cache_salt_narrows_the_scope_within_its_key(make_app, store):
    client = make_app(api_keys=[KEY_A]).test_client()
    job = client.post("/jobs", json={"prompt": "hi", "cache_salt": "tenant-7"}, headers=A).get_json()["id"]
    chat = client.post("/v1/chat/completions", headers=A, json={
        "messages": [{"role": "user", "content": "hi"}], "cache_salt": "tenant-7", "stream": True}).headers["X-Job-Id"]
    for job_id in (job, chat):
        stored = store.get(job_id).request
        assert stored["cache_scope"] == f"{owner_id(KEY_A)}|tenant-7" and "cache_salt" not in stored
    bad = client.post("/jobs", json={"prompt": "hi", "cache_salt": ""}, headers=A)
    assert bad.status_code in (400, 422) and "cache_salt" in str(bad.get_json())


def test_idempotency_key_on_v1_chat_replays_the_first_job(make_app, celery, store):
    """``Idempotency-Key`` counts on ``/v1`` too: a retried chat gets the first job's answer
    (the same job id), and no second job is sent."""
    client = make_app().test_client()
    celery.runner = lambda job_id: run_job(store, job_id)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    first = client.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "k1"})
    again = client.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 200
    assert first.headers["X-Job-Id"] == again.headers["X-Job-Id"]
    assert first.get_json()["choices"] == again.get_json()["choices"] and len(celery.sent) == 1
    too_long = client.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "x" * 201})
    assert too_long.status_code == 400 and "Idempotency-Key" in too_long.get_data(as_text=True)
    assert len(celery.sent) == 1
