"""Deadlines and webhooks at submit (fakeredis, fake Celery): the fields are checked before
anything is written, a refused one is a 400 naming it, an accepted one is stored on the job;
dead letters are listed and replayed per key."""
from __future__ import annotations

import base64
import json
import time

import pytest

from core.batches import BatchStore
from core import keys
from core.events import SUCCEEDED
from core.tasks import WEBHOOK, WEBHOOK_QUEUE
from core.webhooks import WebhookStore
from tests.web.test_openai_batch import intake_done, line, start
from web.guards import owner_id

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123").decode()
HOOK = "http://127.0.0.1:9/hook"
KEY_A, KEY_B = "key-a", "key-b"


def job_body(**extra):
    return {"prompt": "Hi", "max_new_tokens": 4, **extra}


def error_field(response) -> str:
    return response.get_json()["error"]["field"]


def test_a_loopback_webhook_is_refused_without_the_allow_setting_and_nothing_is_queued(make_app, store, celery):
    client = make_app(webhook_secret=SECRET).test_client()
    for path, body in (("/jobs", job_body(webhook_url=HOOK)), ("/agent/run", {"prompt": "2+2?", "webhook_url": HOOK})):
        response = client.post(path, json=body)
        assert response.status_code == 400, response.get_json()
        assert error_field(response) == "webhook_url" and "127.0.0.1" in response.get_json()["error"]["message"]
    assert celery.sent == [] and store.client.zcard(keys.JOBS_INDEX) == 0


@pytest.mark.parametrize("url", ["ftp://example.com/x", "http://10.0.0.7/h", "http://[::1]:8/h", "not a url"])
def test_other_bad_targets_are_refused(make_app, url):
    response = make_app(webhook_secret=SECRET).test_client().post("/jobs", json=job_body(webhook_url=url))
    assert response.status_code == 400 and error_field(response) == "webhook_url"


def test_a_webhook_without_a_secret_is_refused(make_app):
    client = make_app(webhook_allow_hosts="127.0.0.1").test_client()
    response = client.post("/jobs", json=job_body(webhook_url=HOOK))
    assert response.status_code == 400 and error_field(response) == "webhook_url"
    assert "MINISERVE_WEBHOOK_SECRET" in response.get_json()["error"]["message"]


def test_an_allowed_webhook_and_a_deadline_are_stored(make_app, store):
    client = make_app(webhook_secret=SECRET, webhook_allow_hosts="127.0.0.1").test_client()
    before = time.time()
    job_id = client.post("/jobs", json=job_body(webhook_url=HOOK, timeout_s=30)).get_json()["id"]
    view = client.get(f"/jobs/{job_id}").get_json()
    assert view["webhook_url"] == HOOK and before + 30 <= view["deadline"] <= time.time() + 30
    assert store.client.zscore(keys.DEADLINES, job_id) == pytest.approx(view["deadline"])
    deadline = time.time() + 100
    other = client.post("/jobs", json=job_body(deadline=deadline)).get_json()["id"]
    assert client.get(f"/jobs/{other}").get_json()["deadline"] == pytest.approx(deadline)


@pytest.mark.parametrize("fields, named", [
    ({"deadline": 1.0}, "deadline"),                                 # already passed
    ({"deadline": time.time() + 3600, "timeout_s": 5}, "timeout_s"),  # both
    ({"timeout_s": 10 ** 9}, "timeout_s"),                           # past the job's TTL
])
def test_bad_deadlines_are_400s_naming_the_field(make_app, store, celery, fields, named):
    client = make_app().test_client()
    for path, body in (("/jobs", job_body(**fields)), ("/agent/run", {"prompt": "2+2?", **fields})):
        response = client.post(path, json=body)
        assert response.status_code == 400 and error_field(response) == named, response.get_json()
    assert celery.sent == []


def test_a_nonpositive_timeout_is_refused_by_the_schema(client):
    response = client.post("/jobs", json=job_body(timeout_s=0))
    assert response.status_code == 422 and "timeout_s" in str(response.get_json())


def test_a_keys_default_webhook_applies_and_its_own_secret_signs(make_app, store):
    app = make_app(api_keys=f"{KEY_A},{KEY_B}", webhook_secrets=f"{KEY_A}={SECRET}",
                   webhook_urls=f"{KEY_A}={HOOK}", webhook_allow_hosts="127.0.0.1")
    client = app.test_client()
    job_a = client.post("/jobs", json=job_body(), headers={"Authorization": f"Bearer {KEY_A}"}).get_json()["id"]
    assert store.get(job_a).webhook_url == HOOK
    refused = client.post("/jobs", json=job_body(webhook_url=HOOK), headers={"Authorization": f"Bearer {KEY_B}"})
    assert refused.status_code == 400 and error_field(refused) == "webhook_url"  # key B has no secret


def test_cancelling_a_queued_job_sends_its_webhook_try(make_app, store, celery):
    client = make_app(webhook_secret=SECRET, webhook_allow_hosts="127.0.0.1").test_client()
    job_id = client.post("/jobs", json=job_body(webhook_url=HOOK)).get_json()["id"]
    assert client.post(f"/jobs/{job_id}/cancel").get_json()["state"] == "cancelled"
    [hook] = [s for s in celery.sent if s["name"] == WEBHOOK]
    assert hook["args"] == [job_id, 1, 1] and hook["queue"] == WEBHOOK_QUEUE


def dead_letter(store, job_id: str) -> None:
    hooks = WebhookStore(store.client, ttl_s=60, max_tries=1)
    store.start_attempt(job_id, "w", lease_s=30)
    store.finish(job_id, SUCCEEDED, {"text": "x"}, attempt=1)
    hooks.report(hooks.claim(job_id), False, {"status": 500}, retry_at=None)


def test_dead_letters_are_listed_and_replayed_per_key(make_app, store, celery):
    app = make_app(api_keys=f"{KEY_A},{KEY_B}", webhook_secret=SECRET, webhook_allow_hosts="127.0.0.1")
    client = app.test_client()
    a, b = ({"Authorization": f"Bearer {k}"} for k in (KEY_A, KEY_B))
    job_id = client.post("/jobs", json=job_body(webhook_url=HOOK), headers=a).get_json()["id"]
    dead_letter(store, job_id)
    [entry] = client.get("/webhooks/dead", headers=a).get_json()["dead"]
    assert entry["job_id"] == job_id and entry["url"] == HOOK and entry["last_answer"] == {"status": 500}
    assert client.get("/webhooks/dead", headers=b).get_json()["dead"] == []
    assert client.post(f"/webhooks/dead/{job_id}/replay", headers=b).status_code == 404
    assert client.post("/webhooks/dead/nope/replay", headers=a).status_code == 404
    replayed = client.post(f"/webhooks/dead/{job_id}/replay", headers=a)
    assert replayed.status_code == 202 and replayed.get_json()["round"] == 2
    assert [s["args"] for s in celery.sent if s["name"] == WEBHOOK] == [[job_id, 2, 1]]
    assert client.get("/webhooks/dead", headers=a).get_json()["dead"] == []
    assert client.post(f"/webhooks/dead/{job_id}/replay", headers=a).status_code == 404
    assert store.get(job_id).owner == owner_id(KEY_A)


def test_batch_lines_get_the_window_as_deadline_and_the_batch_webhook(make_app, store):
    client = make_app(webhook_secret=SECRET, webhook_allow_hosts="127.0.0.1").test_client()
    batch = intake_done(client, start(client, line("a") + "\n" + line("b") + "\n", webhook_url=HOOK).get_json()["id"])
    entries = BatchStore(store.client).entries(batch["id"])
    jobs = [store.get(entry["job_id"]) for entry in entries]
    assert len(jobs) == 2
    assert all(j.deadline == batch["expires_at"] and j.webhook_url == HOOK for j in jobs)
    refused = start(make_app(webhook_secret=SECRET).test_client(), line("a") + "\n", webhook_url=HOOK)
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "webhook_url"


def test_the_monitor_overview_shows_the_callers_dead_letters(make_app, store):
    client = make_app(api_keys=f"{KEY_A},{KEY_B}", webhook_secret=SECRET, webhook_allow_hosts="127.0.0.1").test_client()
    a, b = ({"Authorization": f"Bearer {k}"} for k in (KEY_A, KEY_B))
    job_id = client.post("/jobs", json=job_body(webhook_url=HOOK), headers=a).get_json()["id"]
    dead_letter(store, job_id)
    assert [d["job_id"] for d in client.get("/overview", headers=a).get_json()["webhooks_dead"]] == [job_id]
    assert client.get("/overview", headers=b).get_json()["webhooks_dead"] == []


def test_a_queued_job_shows_its_place_and_its_stream_counts_down(client, store):
    """Positions on the stream only go down, one ``queued`` frame per move (no ``id:``, so a
    resume still names the last stored event), then the job's own events as before."""
    from tests.web.conftest import parse_sse, run_job

    ids = [client.post("/jobs", json=job_body()).get_json()["id"] for _ in range(3)]
    views = [client.get(f"/jobs/{job_id}").get_json() for job_id in ids]
    assert [v["queue_position"] for v in views] == [0, 1, 2] and views[2]["estimated_start"] is None
    response = client.get(f"/jobs/{ids[2]}/events")
    frames, moves = [], iter([lambda: store.start_attempt(ids[0], "w", lease_s=30),
                              lambda: store.request_cancel(ids[1]),
                              lambda: run_job(store, ids[2])])
    for chunk in response.response:  # each move happens once the stream has shown the last one
        text = chunk if isinstance(chunk, str) else chunk.decode()
        frames.extend(parse_sse(text, place_frames=True))
        if "event: queued" in text:
            assert "id:" not in text
            next(moves)()
    positions = [f["data"]["data"]["queue_position"] for f in frames if f["event"] == "queued"]
    assert positions == [2, 1, 0]
    assert [f["event"] for f in frames if f["event"] != "queued"] == ["state", "token", "token", "token", "done"]
    assert client.get(f"/jobs/{ids[2]}").get_json().get("queue_position") is None
