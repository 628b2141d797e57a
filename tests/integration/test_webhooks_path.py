"""Webhooks on the real stack: redis-server, the web server, a Celery worker on the tiny
model, and a real HTTP receiver thread on 127.0.0.1 (allowed by MINISERVE_WEBHOOK_ALLOW_HOSTS).

Checked by order and counts, never by time (backoff is set to 0.2 s; every wait is a safety
net of 30 s or more): a receiver that fails the first two tries gets the third, every try
signed (the ``standardwebhooks`` package verifies each) with the same ``webhook-id``; the
body is the job's record as ``GET /jobs/{id}`` shows it; a try message delivered twice POSTs
once; a receiver down for good ends in the dead letters, and a replay reaches it once it is up.
"""
from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from standardwebhooks.webhooks import Webhook

from core.tasks import WEBHOOK, WEBHOOK_QUEUE
from core.webhooks import WebhookStore, message_id
from tests.harness.stack import free_port, wait_until
from tests.integration.conftest import started_web, wait_for_worker, wait_terminal

pytestmark = pytest.mark.integration
SECRET = "whsec_" + base64.b64encode(b"miniserve-webhook-test-key").decode()
HOOK_ENV = {"MINISERVE_WEBHOOK_SECRET": SECRET, "MINISERVE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
            "MINISERVE_WEBHOOK_BACKOFF_S": "0.2", "MINISERVE_WEBHOOK_MAX_TRIES": "3",
            "MINISERVE_WEBHOOK_TIMEOUT_S": "5"}
WAIT_S = 60


@dataclass
class Receiver:
    """An HTTP server on 127.0.0.1 recording every POST; ``fail_first`` answers 500 to the
    first N requests of each path."""

    port: int
    fail_first: int = 0
    received: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.lock:
                    seen = sum(1 for r in receiver.received if r["path"] == self.path)
                    status = 500 if seen < receiver.fail_first else 204
                    receiver.received.append({"path": self.path, "headers": dict(self.headers.items()),
                                              "body": body, "status": status})
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def posts(self, path: str) -> list[dict]:
        with self.lock:
            return [r for r in self.received if r["path"] == path]


@pytest.fixture(scope="module")
def hook_stack(shared_stack):
    shared_stack.env_overrides.update(HOOK_ENV)
    return shared_stack


@pytest.fixture(scope="module")
def hook_worker(hook_stack, shared_store):
    proc = hook_stack.start_worker(pool="threads", concurrency=4)
    try:
        wait_for_worker(shared_store)
    except TimeoutError:
        proc.kill()
        raise AssertionError("worker did not come up:\n" + proc.log()[-4000:])
    yield proc
    proc.kill()  # teardown: no graceful stop is under test here


@pytest.fixture(scope="module")
def hook_web(hook_stack, hook_worker):
    proc, base_url = started_web(hook_stack)
    yield base_url
    proc.kill()  # teardown: no graceful stop is under test here


@pytest.fixture(scope="module")
def receiver():
    server = Receiver(free_port(), fail_first=2).start()
    yield server
    server.stop()


def submit(web: str, url: str) -> str:
    response = requests.post(f"{web}/jobs", json={"prompt": "Hello", "max_new_tokens": 4,
                                                  "generation_method": "official", "webhook_url": url}, timeout=30)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def delivery(store, job_id: str) -> dict:
    return WebhookStore(store.client).delivery(job_id) or {}


def test_a_failing_receiver_gets_the_third_try_each_signed_with_one_message_id(hook_web, receiver, shared_store):
    path = "/flaky"
    job_id = submit(hook_web, f"http://127.0.0.1:{receiver.port}{path}")
    wait_until(lambda: len(receiver.posts(path)) >= 3, WAIT_S, what="three webhook tries")
    wait_until(lambda: delivery(shared_store, job_id).get("state") == "delivered", WAIT_S, what="delivered")
    posts = receiver.posts(path)
    assert [p["status"] for p in posts] == [500, 500, 204]
    assert {p["headers"]["webhook-id"] for p in posts} == {message_id(job_id)}
    verifier = Webhook(SECRET)
    bodies = [verifier.verify(p["body"], p["headers"]) for p in posts]  # raises on a bad signature
    shown = requests.get(f"{hook_web}/jobs/{job_id}", timeout=30).json()
    assert bodies[-1] == shown and shown["state"] == "succeeded" and shown["webhook_url"].endswith(path)
    entry = delivery(shared_store, job_id)
    assert entry["tries"] == 3 and entry["round"] == 1 and entry["last_answer"] == {"status": 204}


def test_a_try_message_delivered_twice_posts_once(hook_stack, hook_web, hook_worker, receiver, shared_store):
    from celery import Celery

    path = "/once"
    receiver.fail_first = 0
    job_id = submit(hook_web, f"http://127.0.0.1:{receiver.port}{path}")
    wait_until(lambda: delivery(shared_store, job_id).get("state") == "delivered", WAIT_S, what="delivered")
    client = Celery("miniserve-test-client", broker=hook_stack.redis_url)
    try:  # the broker hands the same try over again (as after a lost connection or a dead worker)
        client.send_task(WEBHOOK, args=[job_id, 1, 1], queue=WEBHOOK_QUEUE)
    finally:
        client.close()
    wait_until(lambda: any(f'"try_id": "1.1"' in line and "webhook_try_repeated" in line and job_id in line
                           for line in hook_worker.log().splitlines()), WAIT_S, what="the repeated try skipped")
    assert len(receiver.posts(path)) == 1 and delivery(shared_store, job_id)["tries"] == 1


def test_a_receiver_down_for_good_ends_dead_and_a_replay_reaches_it_once_up(hook_web, shared_store):
    port = free_port()  # nothing listens here yet: every try is refused
    path = "/later"
    job_id = submit(hook_web, f"http://127.0.0.1:{port}{path}")
    wait_until(lambda: any(d["job_id"] == job_id for d in
                           requests.get(f"{hook_web}/webhooks/dead", timeout=30).json()["dead"]),
               WAIT_S, what="the dead letter")
    [dead] = [d for d in requests.get(f"{hook_web}/webhooks/dead", timeout=30).json()["dead"] if d["job_id"] == job_id]
    assert dead["tries"] == 3 and dead["state"] == "dead" and dead["last_answer"]["error"] == "ConnectionRefusedError"
    late = Receiver(port).start()
    try:
        replay = requests.post(f"{hook_web}/webhooks/dead/{job_id}/replay", timeout=30)
        assert replay.status_code == 202 and replay.json()["round"] == 2
        wait_until(lambda: delivery(shared_store, job_id).get("state") == "delivered", WAIT_S, what="replayed")
        [post] = late.posts(path)
        assert post["headers"]["webhook-id"] == message_id(job_id)
        assert Webhook(SECRET).verify(post["body"], post["headers"])["id"] == job_id
        assert requests.get(f"{hook_web}/webhooks/dead", timeout=30).json()["dead"] == []
        assert wait_terminal(shared_store, job_id, 30).state == "succeeded"
    finally:
        late.stop()
