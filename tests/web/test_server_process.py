"""``python -m web`` as a real process (gunicorn, gthread) on a real redis-server: the Celery
client puts the task on the Redis queue by name, and SSE streams over real sockets."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from core.jobs import JobStore
from tests.web.conftest import parse_sse, run_job

ROOT = Path(__file__).resolve().parents[2]
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path(REDIS_SERVER).exists(), reason="redis-server not installed")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(check, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise TimeoutError("service did not come up")


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    port = _free_port()
    proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path_factory.mktemp("redis"))], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    _wait_for(lambda: redis.Redis.from_url(url).ping())
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(redis_url, tmp_path_factory):
    port = _free_port()
    env = {**os.environ, "MINISERVE_REDIS_URL": redis_url, "MINISERVE_PORT": str(port),
           "MINISERVE_HOST": "127.0.0.1", "MINISERVE_CACHE_DIR": str(tmp_path_factory.mktemp("cache")),
           "MINISERVE_WEB_WORKERS": "1", "MINISERVE_SSE_KEEPALIVE_S": "1", "MINISERVE_API_KEYS": ""}
    log = tmp_path_factory.mktemp("log") / "web.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "web"], cwd=ROOT, env=env, stdout=out, stderr=out)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: urllib.request.urlopen(f"{base}/healthz", timeout=1).status == 200)
        yield base, log
    finally:
        proc.terminate()
        proc.wait(timeout=15)


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
    started = time.monotonic()
    with urllib.request.urlopen(f"{base}/jobs/{job_id}/events", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        body = response.read().decode()
    writer.join()
    assert [f["event"] for f in parse_sse(body)] == ["state", "token", "token", "token", "done"]
    assert time.monotonic() - started < 8
