"""Files and Batches (``/v1/files``, ``/v1/batches``) on fakeredis with a fake worker: lines
become chat jobs, bad lines become error lines, the output is read from the jobs."""
from __future__ import annotations

import io
import json

import pytest

from core.events import FAILED
from core.workers import write_heartbeat
from tests.harness.stack import wait_until
from tests.web.conftest import run_job


def line(custom_id: str, content: str = "Hi", **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": content}],
                                "max_tokens": 4, **body}})


def upload(client, text: str, purpose: str = "batch"):
    return client.post("/v1/files", data={"purpose": purpose, "file": (io.BytesIO(text.encode()), "in.jsonl")},
                       content_type="multipart/form-data")


def start(client, text: str, **extra):
    file_id = upload(client, text).get_json()["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **extra}
    return client.post("/v1/batches", json=body)


def started(client, text: str, headers: dict | None = None, **extra) -> dict:
    """POST the batch (it answers ``validating``), then the batch once its intake has read
    every line (the intake is a thread of the app: :mod:`web.openai.batch_intake`)."""
    answer = start(client, text, **extra).get_json()
    assert answer["status"] == "validating" and answer["request_counts"]["total"] == 0, answer
    return intake_done(client, answer["id"], headers)


def intake_done(client, batch_id: str, headers: dict | None = None) -> dict:
    seen: dict = {}

    def read() -> bool:
        seen.update(client.get(f"/v1/batches/{batch_id}", headers=headers or {}).get_json())
        return seen["status"] != "validating"

    wait_until(read, 30, interval_s=0.01, what="the batch's intake")  # a safety net: ends on the state
    return seen


def content(client, file_id: str) -> list[dict]:
    return [json.loads(x) for x in client.get(f"/v1/files/{file_id}/content").get_data(as_text=True).splitlines()]


def test_a_file_round_trips_and_a_missing_one_is_a_404(client):
    text = line("a") + "\n"
    created = upload(client, text).get_json()
    assert created["object"] == "file" and created["purpose"] == "batch" and created["bytes"] == len(text)
    assert client.get(f"/v1/files/{created['id']}").get_json() == created
    assert client.get(f"/v1/files/{created['id']}/content").get_data(as_text=True) == text
    missing = client.get("/v1/files/file-" + "0" * 32)
    assert missing.status_code == 404 and missing.get_json()["error"]["param"] == "file_id"
    assert client.get("/v1/files/../jobs").status_code == 404


def test_upload_checks_purpose_size_and_encoding(make_app):
    client = make_app(max_file_bytes=1000).test_client()
    assert upload(client, line("a"), purpose="fine-tune").get_json()["error"]["param"] == "purpose"
    big = upload(client, line("a", "x" * 2000))
    assert big.status_code == 413 and big.get_json()["error"]["param"] == "file"
    huge = upload(client, line("a", "x" * 100_000))
    assert huge.status_code == 413
    bad = client.post("/v1/files", data={"purpose": "batch", "file": (io.BytesIO(b"\xff\xfe"), "x")},
                      content_type="multipart/form-data")
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "file"
    missing = client.post("/v1/files", data={"purpose": "batch"}, content_type="multipart/form-data")
    assert missing.status_code == 400 and missing.get_json()["error"]["param"] == "file"
    as_json = client.post("/v1/files", json={"purpose": "batch"})
    assert as_json.status_code == 400 and as_json.get_json()["error"]["param"] in ("file", "purpose")


def test_batch_create_refuses_other_endpoints_and_windows(client):
    assert start(client, line("a"), endpoint="/v1/embeddings").get_json()["error"]["param"] == "endpoint"
    assert start(client, line("a"), completion_window="1h").get_json()["error"]["param"] == "completion_window"
    unknown = client.post("/v1/batches", json={"input_file_id": "file-" + "1" * 32,
                                               "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert unknown.status_code == 404 and unknown.get_json()["error"]["param"] == "file_id"


def test_lines_become_jobs_and_bad_lines_become_error_lines(client, store, celery):
    text = "\n".join([line("ok1"), line("bad-field", store=True), "{not json", line("ok2"),
                      line("ok1"), line("long", max_tokens=10**6), line("streamed", stream=True),
                      json.dumps({"custom_id": "u", "method": "POST", "url": "/v1/embeddings", "body": {}})])
    batch = started(client, text)
    assert batch["status"] == "in_progress" and batch["request_counts"] == {"total": 8, "completed": 0, "failed": 6}
    assert [store.get(s["task_id"]).type for s in celery.sent] == ["chat", "chat"]
    for sent in celery.sent:
        run_job(store, sent["task_id"])
    done = client.get(f"/v1/batches/{batch['id']}").get_json()
    assert done["status"] == "completed" and done["request_counts"] == {"total": 8, "completed": 2, "failed": 6}
    output = content(client, done["output_file_id"])
    assert [o["custom_id"] for o in output] == ["ok1", "ok2"]
    assert output[0]["response"]["status_code"] == 200 and output[0]["error"] is None
    assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == "Hello wörld"
    assert output[0]["response"]["request_id"] == celery.sent[0]["task_id"]
    errors = content(client, done["error_file_id"])
    by_id = {e["custom_id"]: e for e in errors}
    assert [e["custom_id"] for e in errors] == ["bad-field", None, "ok1", "long", "streamed", "u"]
    assert by_id["bad-field"]["response"]["body"]["error"]["param"] == "store"
    assert by_id["ok1"]["response"]["body"]["error"]["code"] == "duplicate_custom_id"
    assert by_id["long"]["response"]["body"]["error"]["param"] == "max_tokens"
    assert by_id["streamed"]["response"]["body"]["error"]["param"] == "stream"
    assert by_id["u"]["response"] is None and by_id["u"]["error"]["code"] == "invalid_url"
    assert by_id[None]["error"]["code"] == "invalid_json_line"


def test_failed_jobs_go_to_the_error_file_and_progress_counts_them(client, store, celery):
    batch = started(client, "\n".join(line(f"r{i}") for i in range(3)))
    run_job(store, celery.sent[0]["task_id"])
    partial = client.get(f"/v1/batches/{batch['id']}").get_json()
    assert partial["status"] == "in_progress" and partial["request_counts"]["completed"] == 1
    run_job(store, celery.sent[1]["task_id"], state=FAILED, payload={"code": "engine_error", "message": "boom"})
    run_job(store, celery.sent[2]["task_id"])
    done = client.get(f"/v1/batches/{batch['id']}").get_json()
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    [failed] = content(client, done["error_file_id"])
    assert failed["custom_id"] == "r1" and failed["response"]["status_code"] == 500
    assert failed["response"]["body"]["error"]["code"] == "engine_error"


def test_cancel_stops_open_jobs_and_ends_cancelled(client, store, celery):
    batch = started(client, "\n".join(line(f"r{i}") for i in range(3)))
    run_job(store, celery.sent[0]["task_id"])
    cancelled = client.post(f"/v1/batches/{batch['id']}/cancel").get_json()
    assert cancelled["status"] == "cancelled" and cancelled["cancelling_at"] and cancelled["cancelled_at"]
    assert sorted(celery.control.revoked) == sorted(s["task_id"] for s in celery.sent[1:])
    assert [o["custom_id"] for o in content(client, cancelled["output_file_id"])] == ["r0"]
    codes = [e["response"]["status_code"] for e in content(client, cancelled["error_file_id"])]
    assert codes == [409, 409]
    assert client.post(f"/v1/batches/{batch['id']}/cancel").get_json()["status"] == "cancelled"


def test_an_empty_file_fails_the_batch_and_the_list_pages(client):
    failed = started(client, "\n\n")
    assert failed["status"] == "failed" and failed["errors"]["data"][0]["code"] == "empty_file"
    second = started(client, line("a"))
    page = client.get("/v1/batches?limit=1").get_json()
    assert [b["id"] for b in page["data"]] == [second["id"]] and page["has_more"] is True
    rest = client.get(f"/v1/batches?after={second['id']}").get_json()
    assert [b["id"] for b in rest["data"]] == [failed["id"]] and rest["has_more"] is False


@pytest.mark.parametrize("path", ["/v1/batches/batch_xyz", "/v1/batches/" + "a" * 32])
def test_unknown_batches_are_404(client, path):
    response = client.get(path)
    assert response.status_code == 404 and response.get_json()["error"]["code"] == "batch_not_found"


def test_files_and_batches_are_private_to_their_key(make_app):
    client = make_app(api_keys=["key-a", "key-b"]).test_client()
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    created = client.post("/v1/files", headers=a, content_type="multipart/form-data",
                          data={"purpose": "batch", "file": (io.BytesIO(line("x").encode()), "in.jsonl")}).get_json()
    assert client.get(f"/v1/files/{created['id']}", headers=b).status_code == 404
    body = {"input_file_id": created["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    assert client.post("/v1/batches", headers=b, json=body).status_code == 404
    batch = intake_done(client, client.post("/v1/batches", headers=a, json=body).get_json()["id"], a)
    assert batch["status"] == "in_progress" and batch["request_counts"]["total"] == 1
    assert client.get(f"/v1/batches/{batch['id']}", headers=b).status_code == 404
    assert client.post(f"/v1/batches/{batch['id']}/cancel", headers=b).status_code == 404
    assert client.get("/v1/batches", headers=b).get_json()["data"] == []
    assert [x["id"] for x in client.get("/v1/batches", headers=a).get_json()["data"]] == [batch["id"]]


def test_a_line_the_limits_refuse_at_finalizing_still_gets_its_answer(make_app, store, celery):
    """The cap fell after the line was queued: the job's text is still its answer."""
    batch = started(make_app().test_client(), line("a", max_tokens=100))
    run_job(store, celery.sent[0]["task_id"])
    done = make_app(max_new_tokens_cap=10).test_client().get(f"/v1/batches/{batch['id']}").get_json()
    [item] = content(make_app().test_client(), done["output_file_id"])
    assert item["response"]["body"]["choices"][0]["message"]["content"] == "Hello wörld"


def test_a_line_naming_an_unknown_model_is_a_404_error_line(client, store, celery, redis_client):
    write_heartbeat(redis_client, "b@h:1", {"model_id": "other-model", "queue": "q"})  # two models: names matter
    batch = started(client, "\n".join([line("known"), line("other", model="no-such-model")]))
    run_job(store, celery.sent[0]["task_id"])
    done = client.get(f"/v1/batches/{batch['id']}").get_json()
    [error] = content(client, done["error_file_id"])
    assert error["custom_id"] == "other" and error["response"]["status_code"] == 404
    assert error["response"]["body"]["error"]["code"] == "model_not_found"


def test_file_quotas_per_key_give_a_429_and_delete_frees_them(make_app):
    client = make_app(api_keys=["key-a", "key-b"], max_files_per_key=2, max_file_store_bytes_per_key=1000).test_client()
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}

    def up(headers, size=10):
        return client.post("/v1/files", headers=headers, content_type="multipart/form-data",
                           data={"purpose": "batch", "file": (io.BytesIO(b"x" * size), "in.jsonl")})

    first, second = up(a).get_json()["id"], up(a).get_json()["id"]
    over = up(a)
    assert over.status_code == 429 and over.get_json()["error"]["code"] == "file_quota_exceeded"
    assert "MINISERVE_MAX_FILES_PER_KEY" in over.get_json()["error"]["message"] and over.headers["Retry-After"]
    assert up(b).status_code == 200  # another key's quota is its own
    assert client.delete(f"/v1/files/{first}", headers=b).status_code == 404  # not b's to delete
    deleted = client.delete(f"/v1/files/{first}", headers=a)
    assert deleted.status_code == 200 and deleted.get_json() == {"id": first, "object": "file", "deleted": True}
    assert client.get(f"/v1/files/{first}", headers=a).status_code == 404
    assert client.delete(f"/v1/files/{first}", headers=a).status_code == 404
    assert up(a).status_code == 200  # the deleted file's place is free again
    assert client.delete(f"/v1/files/{second}", headers=a).status_code == 200
    too_big = up(a, size=995)  # 10 held + 995 > 1000 bytes
    assert too_big.status_code == 429 and "BYTES_PER_KEY" in too_big.get_json()["error"]["message"]


def test_a_line_larger_than_one_request_may_be_is_an_error_line(make_app, store, celery):
    """A batch line over MINISERVE_MAX_BODY_BYTES is refused before it is parsed or tokenized:
    one line can cost the web no more than the same request sent alone."""
    client = make_app(max_body_bytes=2000).test_client()
    batch = started(client, "\n".join([line("small"), line("huge", content="x " * 2000)]))
    assert batch["request_counts"] == {"total": 2, "completed": 0, "failed": 1} and len(celery.sent) == 1
    for sent in celery.sent:
        run_job(store, sent["task_id"])
    errors = content(client, client.get(f"/v1/batches/{batch['id']}").get_json()["error_file_id"])
    (error,) = errors
    assert error["response"]["status_code"] == 413 and error["response"]["body"]["error"]["code"] == "line_too_large"
