"""``GET /jobs/{id}/events``: replay, Last-Event-ID / ?after= resume, live follow, keep-alives.
Events are written with JobStore directly, as the worker writes them."""
from __future__ import annotations

import threading

import pytest

from tests.harness.bounded import returns
from tests.web.conftest import parse_sse, run_job


def _submit(client) -> str:
    return client.post("/jobs", json={"prompt": "hi"}).get_json()["id"]


def test_replay_after_the_job_finished_gives_every_event_in_order(client, store):
    job_id = _submit(client)
    run_job(store, job_id)
    response = client.get(f"/jobs/{job_id}/events")
    assert response.status_code == 200
    assert response.mimetype == "text/event-stream"
    assert response.headers["Cache-Control"] == "no-cache"
    frames = parse_sse(response.get_data(as_text=True))
    assert [f["event"] for f in frames] == ["state", "token", "token", "token", "done"]
    assert [int(f["id"]) for f in frames] == [1, 2, 3, 4, 5]
    assert all(f["data"]["seq"] == int(f["id"]) and f["data"]["type"] == f["event"] for f in frames)
    text = "".join(f["data"]["data"]["text"] for f in frames if f["event"] == "token")
    assert text == client.get(f"/jobs/{job_id}").get_json()["result"]["text"] == "Hello wörld"
    done = frames[-1]["data"]["data"]  # a summary: the full result is stored once, in the job
    assert done["result"] == "job" and "text" not in done and done["usage"]["completion_tokens"] == 3
    assert frames[0]["data"]["attempt"] == 1


def test_last_event_id_resumes_without_duplicates(client, store):
    job_id = _submit(client)
    run_job(store, job_id)
    frames = parse_sse(client.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": "3"}).get_data(as_text=True))
    assert [int(f["id"]) for f in frames] == [4, 5]
    frames = parse_sse(client.get(f"/jobs/{job_id}/events?after=4").get_data(as_text=True))
    assert [f["event"] for f in frames] == ["done"]


def test_resume_after_the_terminal_event_ends_at_once(make_app, store):
    client = make_app(sse_keepalive_s=1).test_client()
    job_id = _submit(client)
    run_job(store, job_id)
    body = returns(lambda: client.get(f"/jobs/{job_id}/events?after=5").get_data(as_text=True))
    assert parse_sse(body) == [] and ": keep-alive" not in body  # closed before its first idle tick


def test_bad_last_event_id_is_400(client):
    job_id = _submit(client)
    response = client.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": "abc"})
    assert response.status_code == 400
    assert response.get_json()["error"]["field"] == "Last-Event-ID"
    assert client.get(f"/jobs/{job_id}/events?after=-1").status_code == 422


def test_follows_a_running_job_live_with_keepalives(client, store):
    job_id = _submit(client)
    writer = threading.Thread(target=run_job, args=(store, job_id), kwargs={"delay_s": 0.6})
    writer.start()
    response = client.get(f"/jobs/{job_id}/events")
    chunks = []
    for chunk in response.response:  # streamed: read frame by frame as a browser would
        chunks.append(chunk if isinstance(chunk, str) else chunk.decode())
    writer.join()
    body = "".join(chunks)
    frames = parse_sse(body)
    assert [f["event"] for f in frames] == ["state", "token", "token", "token", "done"]
    assert body.startswith("retry: ")


def test_idle_stream_sends_keepalive_comments(make_app, store):
    client = make_app(sse_keepalive_s=1).test_client()
    job_id = _submit(client)
    threading.Timer(1.6, run_job, args=(store, job_id)).start()
    body = client.get(f"/jobs/{job_id}/events").get_data(as_text=True)
    assert ": keep-alive" in body
    assert parse_sse(body)[-1]["event"] == "done"


def test_stream_ends_when_the_job_expires(make_app, store):
    client = make_app(sse_keepalive_s=1).test_client()
    job_id = _submit(client)
    threading.Timer(0.3, store.client.delete, args=(f"job:{job_id}",)).start()
    body = returns(lambda: client.get(f"/jobs/{job_id}/events").get_data(as_text=True))
    assert parse_sse(body) == []  # the stream ended (the record is gone), no event made up


@pytest.mark.parametrize("finished", [False, True])
@pytest.mark.parametrize("how", ["header", "query"])
@pytest.mark.parametrize("value", [str(2**64), str(2**63), "9" * 40, "1" * 5000])
def test_out_of_range_event_id_is_400_on_running_and_finished_jobs(client, store, finished, how, value):
    """Issue 15, item 5: 2^64 used to answer 200 and then drop the connection."""
    job_id = _submit(client)
    started = store.start_attempt(job_id, "w", lease_s=30)
    if finished:
        store.finish(job_id, "succeeded", {"text": ""}, attempt=started.attempt)
    if how == "header":
        response = client.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": value})
    else:
        response = client.get(f"/jobs/{job_id}/events?after={value}")
    error = response.get_json()["error"]
    if how == "query" and len(value) > 1000:  # pydantic refuses to parse an int that long
        assert response.status_code == 422 and error["field"] == "after"
        return
    assert response.status_code == 400, error
    assert error["code"] == "bad_last_event_id"
    assert error["field"] == ("Last-Event-ID" if how == "header" else "after")


def test_largest_event_id_is_accepted(client, store):
    job_id = _submit(client)
    run_job(store, job_id)
    response = client.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": str(2**63 - 1)})
    assert response.status_code == 200 and parse_sse(response.get_data(as_text=True)) == []
