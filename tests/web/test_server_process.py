"""``python -m web`` as a real process (gunicorn, gevent) on a real redis-server: the Celery
client puts the task on the Redis queue by name, and SSE streams over real sockets."""
from __future__ import annotations

import json
import threading
import urllib.request

import pytest
import redis

from core.jobs import JobStore
from tests.web.conftest import parse_sse, run_job
from tests.web.processes import HAVE_REDIS_SERVER, redis_server, web_server

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not HAVE_REDIS_SERVER, reason="redis-server not installed")]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(scope="module")
def server(redis_url, tmp_path_factory):
    log = tmp_path_factory.mktemp("log") / "web.log"
    with web_server(redis_url, tmp_path_factory.mktemp("cache"), log) as base:
        yield base, log


def _call(method: str, url: str, body: dict | None = None) -> tuple[int, dict, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def test_served_by_gunicorn_and_task_lands_on_the_redis_queue(server, redis_url):
    base, log = server
    status, headers, health = _call("GET", f"{base}/healthz")
    assert status == 200 and health["redis"] is True and headers["Server"].startswith("gunicorn")
    status, _, accepted = _call("POST", f"{base}/jobs", {"prompt": "hi"})
    assert status == 202
    message = json.loads(redis.Redis.from_url(redis_url).lindex("generation", 0))
    assert message["headers"]["task"] == "miniserve.generate" and message["headers"]["id"] == accepted["id"]
    assert _call("GET", f"{base}/queues")[2]["queues"]["generation"] == 1
    assert _call("POST", f"{base}/jobs", {"prompt": 1})[0] == 422
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert {"method": "POST", "path": "/jobs", "status": 202, "job_id": accepted["id"]}.items() <= \
        next(e for e in entries if e.get("status") == 202).items()


def test_sse_streams_live_over_a_real_socket(server, redis_url):
    base, _ = server
    job_id = _call("POST", f"{base}/jobs", {"prompt": "hi"})[2]["id"]
    store = JobStore(redis.Redis.from_url(redis_url, decode_responses=True))
    writer = threading.Timer(0.5, run_job, args=(store, job_id), kwargs={"delay_s": 0.3})
    writer.start()
    with urllib.request.urlopen(f"{base}/jobs/{job_id}/events", timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        body = response.read().decode()
    writer.join()
    assert [f["event"] for f in parse_sse(body)] == ["state", "token", "token", "token", "done"]
