"""Requests no HTTP client sends, over a bare socket to a real ``python -m web`` (gunicorn)
on a real redis-server: bodies are complete or refused, never a job; every answer, those
gunicorn writes itself included, is JSON in the documented shape; no 5xx."""
from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest
import redis

from core import keys
from core.jobs import JobStore
from tests.web.processes import HAVE_REDIS_SERVER, redis_server, web_server
from tests.web.raw_http import RawResponse, chunked, exchange, request_bytes

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not HAVE_REDIS_SERVER, reason="redis-server not installed")]
BODY_TIMEOUT_S = 2
MAX_BODY = 1_000_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        log = tmp_path_factory.mktemp("log") / "web.log"
        with web_server(url, tmp_path_factory.mktemp("cache"), log, MINISERVE_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
                        MINISERVE_MAX_BODY_BYTES=str(MAX_BODY)) as base:
            yield urlsplit(base).port, JobStore(redis.Redis.from_url(url, decode_responses=True)), log


def _jobs(store: JobStore) -> int:
    return store.client.zcard(keys.JOBS_INDEX)


def _error(reply: RawResponse, status: int, code: str | None = None) -> dict:
    assert reply.status == status, (reply.status, reply.body[:300])
    assert reply.headers["content-type"].startswith("application/json"), reply.headers
    error = reply.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


def test_a_body_shorter_than_its_length_is_400_and_no_job(stack):
    port, store, _ = stack
    before = _jobs(store)
    reply = exchange(port, request_bytes("POST", "/jobs", b'{"prompt":"x"}', content_length=50))
    error = _error(reply, 400, "incomplete_body")
    assert error["field"] == "body" and "14 of its 50 bytes" in error["message"]
    assert _jobs(store) == before


def test_a_body_that_stops_arriving_is_400_after_the_body_timeout_and_no_job(stack):
    port, store, _ = stack
    before = _jobs(store)
    reply = exchange(port, request_bytes("POST", "/jobs", b'{"prompt":"x"}', content_length=50), close_write=False)
    _error(reply, 400, "incomplete_body")
    assert BODY_TIMEOUT_S - 0.5 < reply.elapsed_s < BODY_TIMEOUT_S + 5
    assert _jobs(store) == before


def test_a_complete_raw_body_still_makes_a_job(stack):
    port, store, _ = stack
    before = _jobs(store)
    reply = exchange(port, request_bytes("POST", "/jobs", b'{"prompt":"x"}'))
    assert reply.status == 202 and reply.json()["state"] == "queued"
    assert _jobs(store) == before + 1


@pytest.mark.parametrize("size", [MAX_BODY + 1, 2 * MAX_BODY])
def test_an_oversize_chunked_body_is_413(stack, size):
    port, store, _ = stack
    before = _jobs(store)
    body = b'{"prompt": "' + b"x" * size + b'"}'
    reply = exchange(port, request_bytes("POST", "/jobs", chunked(body), headers={"Transfer-Encoding": "chunked"}))
    _error(reply, 413, "body_too_large")
    assert _jobs(store) == before


def test_a_chunked_body_within_the_limit_is_accepted(stack):
    port, _, _ = stack
    body = json.dumps({"prompt": "y " * 45_000}).encode()  # under the 100,000-character prompt limit
    reply = exchange(port, request_bytes("POST", "/jobs", chunked(body, 4096), headers={"Transfer-Encoding": "chunked"}))
    assert reply.status == 202, reply.body[:300]


def test_broken_chunk_framing_is_a_json_400(stack):
    port, store, _ = stack
    before = _jobs(store)
    raw = request_bytes("POST", "/jobs", b"zz\r\n{}\r\n0\r\n\r\n", headers={"Transfer-Encoding": "chunked"})
    _error(exchange(port, raw), 400)
    truncated = request_bytes("POST", "/jobs", b"40\r\n{\"prompt\": \"x\"}", headers={"Transfer-Encoding": "chunked"})
    _error(exchange(port, truncated), 400, "incomplete_body")
    assert _jobs(store) == before


@pytest.mark.parametrize("length", ["-5", "abc", "1e3", "99999999999999999999999"])
def test_bad_and_huge_content_lengths_are_json(stack, length):
    port, store, _ = stack
    before = _jobs(store)
    reply = exchange(port, request_bytes("POST", "/jobs", b'{"prompt":"x"}', content_length=length))
    assert reply.status in (400, 413)
    _error(reply, reply.status, "body_too_large" if reply.status == 413 else "bad_request")
    assert _jobs(store) == before


def test_gunicorns_own_refusals_are_json(stack):
    port, _, log = stack
    _error(exchange(port, request_bytes("GET", "/jobs/" + "a" * 5000)), 414, "uri_too_long")
    many = {f"X-H{i}": "v" for i in range(200)}
    _error(exchange(port, request_bytes("GET", "/healthz", headers=many)), 431)
    _error(exchange(port, b"GARBAGE\r\n\r\n"), 400, "bad_request")
    _error(exchange(port, request_bytes("POST", "/jobs", b"{}", headers={"Transfer-Encoding": "br"})), 501)


def test_ids_that_are_not_a_job_ids_shape_are_404_and_name_no_key(stack):
    port, store, _ = stack
    reply = exchange(port, request_bytes("POST", "/jobs", b'{"prompt":"x"}'))
    job_id = reply.json()["id"]
    store.request_cancel(job_id)  # the job now has its hash, its event stream and its cancel flag
    for suffix in (":events", ":cancel", ":live", "%3Aevents", "%25", "/../x"):
        for target in (f"/jobs/{job_id}{suffix}", f"/jobs/{job_id}{suffix}/events"):
            reply = exchange(port, request_bytes("GET", target))
            _error(reply, 404)
    _error(exchange(port, request_bytes("GET", "/jobs/%ff%fe")), 404, "job_not_found")
    assert exchange(port, request_bytes("GET", f"/jobs/{job_id}")).status == 200


@pytest.mark.parametrize("path,body,field", [
    ("/jobs", {"prompt": "x", "prefix": "\ud800"}, "prefix"),
    ("/jobs", {"prompt": "x", "system": "\udfff"}, "system"),
    ("/generate", {"prompt": "a\ud800b"}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages.0.content"),
])
def test_lone_surrogates_are_422_naming_the_field(stack, path, body, field):
    port, store, _ = stack
    before = _jobs(store)
    reply = exchange(port, request_bytes("POST", path, json.dumps(body).encode()))  # ensure_ascii: "\ud800"
    status = 400 if path.startswith("/v1/") else 422
    error = _error(reply, status)
    assert error.get("field", error.get("param")) == field, error
    assert _jobs(store) == before


def test_a_json_string_holding_json_is_not_a_body(stack):
    port, store, _ = stack
    before = _jobs(store)
    for path in ("/jobs", "/generate", "/agent/run", "/bench", "/v1/chat/completions"):
        reply = exchange(port, request_bytes("POST", path, json.dumps(json.dumps({"prompt": "x"})).encode()))
        error = _error(reply, 400 if path.startswith("/v1/") else 422)
        assert error.get("field", error.get("param")) == "body" and "not a string" in error["message"], error
    assert _jobs(store) == before


def test_the_log_holds_no_traceback(stack):
    _, _, log = stack
    text = log.read_text()
    assert "Traceback" not in text and "internal_error" not in text
