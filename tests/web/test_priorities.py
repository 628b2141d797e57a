"""Priority classes and per-key limits at submit (fakeredis, fake Celery): each surface's
default class, a key's cap (403 above it), its queued-jobs limit (429), and a held job that
is stored, counted and placed in line but not sent until its turn (docs/scheduling.md)."""
from __future__ import annotations

from core import keys
from tests.web.conftest import run_job
from tests.web.test_openai_batch import line, started

KEY_A, KEY_B = "key-a", "key-b"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def job(client, headers=None, **body):
    return client.post("/jobs", json={"prompt": "Hi", "max_new_tokens": 4, **body}, headers=headers or {})


def stored_priority(store, job_id: str) -> str:
    return store.get(job_id).request["priority"]


def test_each_surface_has_its_default_class_and_a_body_may_name_one(make_app, store, celery):
    client = make_app().test_client()
    assert stored_priority(store, job(client).get_json()["id"]) == "default"
    assert stored_priority(store, job(client, priority="batch").get_json()["id"]) == "batch"
    celery.runner = lambda job_id: run_job(store, job_id)  # /agent/run waits for its answer
    client.post("/agent/run", json={"prompt": "2+2?", "priority": "interactive"})
    assert stored_priority(store, celery.sent[-1]["task_id"]) == "interactive"
    celery.runner = None
    created = started(client, "\n".join(line(f"r{i}") for i in range(2)))
    assert created["status"] == "in_progress"
    lines = [m["task_id"] for m in celery.sent[-2:]]
    assert [stored_priority(store, job_id) for job_id in lines] == ["batch", "batch"]


def test_a_class_that_is_not_one_is_a_4xx_naming_the_field(make_app, store, celery):
    client = make_app().test_client()
    for response in (job(client, priority="urgent"),
                     client.post("/v1/chat/completions", json={**CHAT, "priority": 1})):
        assert response.status_code in (400, 422), response.get_json()
        assert "priority" in response.get_data(as_text=True)
    assert celery.sent == []


def test_a_capped_key_gets_its_cap_as_default_and_a_403_above_it(make_app, store, celery):
    client = make_app(api_keys=[KEY_A, KEY_B], key_priority_caps={KEY_B: "default"}).test_client()
    refused = job(client, B, priority="interactive")
    assert refused.status_code == 403 and refused.get_json()["error"]["field"] == "priority"
    assert stored_priority(store, job(client, B, priority="batch").get_json()["id"]) == "batch"
    assert stored_priority(store, job(client, A, priority="interactive").get_json()["id"]) == "interactive"
    celery.runner = lambda job_id: run_job(store, job_id)  # the chat waits for its answer
    assert client.post("/v1/chat/completions", json=CHAT, headers=B).status_code == 200
    chat_id = celery.sent[-1]["task_id"]
    assert stored_priority(store, chat_id) == "default"  # /v1's interactive, lowered to the key's cap


def test_a_key_over_its_queued_limit_gets_429_and_other_keys_do_not(make_app, celery):
    client = make_app(api_keys=[KEY_A, KEY_B], key_max_queued=2).test_client()
    assert [job(client, A).status_code for _ in range(3)] == [202, 202, 429]
    limited = job(client, A)
    assert limited.get_json()["error"]["code"] == "too_many_queued" and int(limited.headers["Retry-After"]) >= 1
    assert job(client, B).status_code == 202
    assert len(celery.sent) == 3


def test_a_held_job_is_stored_placed_and_counted_but_not_sent(make_app, store, celery):
    client = make_app(queue_window=1).test_client()
    first, held = (job(client).get_json()["id"] for _ in range(2))
    assert [m["task_id"] for m in celery.sent] == [first]
    view = client.get(f"/jobs/{held}").get_json()
    assert view["state"] == "queued" and view["queue_position"] == 1
    assert client.get("/queues").get_json()["queues"]["generation"] == 1  # the held one (the fake Celery keeps the message)
    assert store.client.zscore(keys.UNDISPATCHED, held) is None
    client.post(f"/jobs/{first}/cancel")  # the line moves: the held job's turn
    assert [m["task_id"] for m in celery.sent] == [first, held]
    assert client.get(f"/jobs/{held}").get_json()["queue_position"] == 0


def test_the_monitor_shows_held_jobs_by_class_and_key_and_hides_other_keys(make_app):
    client = make_app(api_keys=[KEY_A, KEY_B], admin_api_keys=["admin"], queue_window=1).test_client()
    job(client, A)  # sent: the window is full after it
    for headers, priority in ((A, "batch"), (A, "batch"), (B, "batch"), (B, "interactive")):
        assert job(client, headers, priority=priority).status_code == 202
    seen_by_a = client.get("/overview", headers=A).get_json()["held"]["generation"]
    assert seen_by_a == {"interactive": {"others": 1}, "batch": {"you": 2, "others": 1}}
    seen_by_admin = client.get("/overview", headers={"Authorization": "Bearer admin"}).get_json()["held"]
    assert sorted(seen_by_admin["generation"]["batch"].values()) == [1, 2]


def test_a_keys_tokens_per_minute_are_capped_and_other_keys_go_on(make_app, celery):
    client = make_app(api_keys=[KEY_A, KEY_B], key_tokens_per_minute=200).test_client()
    sent = [job(client, A, max_new_tokens=60).status_code for _ in range(4)]
    assert sent[:2] == [202, 202] and sent[-1] == 429  # each costs its prompt's tokens plus 60
    limited = job(client, A, max_new_tokens=60)
    assert limited.get_json()["error"]["code"] == "tokens_per_minute_exceeded"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert job(client, B, max_new_tokens=60).status_code == 202
    too_big = job(client, B, max_new_tokens=500)
    assert too_big.status_code == 400 and too_big.get_json()["error"]["field"] == "max_new_tokens"
    assert len(celery.sent) == sum(code == 202 for code in sent) + 1
