"""Fast web tests: fakeredis behind the real JobStore, and a fake Celery client that records
what would be sent (and can play the worker's part, writing events as the worker would)."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import fakeredis
import pytest

from core.events import SUCCEEDED
from core.jobs import JobStore
from core.settings import load_settings
from web import create_app


@dataclass
class FakeControl:
    revoked: list[str] = field(default_factory=list)

    def revoke(self, task_id: str, **_: Any) -> None:
        self.revoked.append(task_id)


@dataclass
class FakeCelery:
    """Records ``send_task``; with ``runner`` set, runs the job (synchronously or in a thread)."""

    sent: list[dict[str, Any]] = field(default_factory=list)
    control: FakeControl = field(default_factory=FakeControl)
    runner: Callable[[str], None] | None = None
    threaded: bool = False

    def send_task(self, name: str, args=None, kwargs=None, **options: Any) -> None:
        self.sent.append({"name": name, "args": list(args or []), **options})
        if self.runner is not None:
            job_id = (args or [options.get("task_id")])[0]
            if self.threaded:
                threading.Thread(target=self.runner, args=(job_id,), daemon=True).start()
            else:
                self.runner(job_id)


def run_job(store: JobStore, job_id: str, chunks=("Hel", "lo", " wörld"), delay_s: float = 0.0,
            state: str = SUCCEEDED, payload: dict | None = None) -> None:
    """What a worker does: start an attempt, append token events, finish."""
    started = store.start_attempt(job_id, "fake-worker", lease_s=30)
    for chunk in chunks:
        time.sleep(delay_s)
        store.append_event(job_id, started.attempt, "token", {"text": chunk})
    text = "".join(chunks)
    if payload is None:
        payload = {"text": text, "finish_reason": "length", "method": "official",
                   "usage": {"prompt_tokens": 5, "completion_tokens": len(chunks), "cached_tokens": 0},
                   "timings": {"ttft_s": 0.01, "total_s": 0.02, "decode_tokens_per_s": 100.0}}
    store.finish(job_id, state, payload, attempt=started.attempt)


@pytest.fixture
def redis_client():
    return fakeredis.FakeRedis(decode_responses=True)


@pytest.fixture
def store(redis_client):
    return JobStore(redis_client, ttl_s=600)


@pytest.fixture
def celery():
    return FakeCelery()


@pytest.fixture
def make_app(store, celery, tmp_path):
    def _make(**overrides: Any):
        # queue_window 0: no fair gate (every job's message is sent at once), since the fake
        # worker (run_job) does not release held jobs as a worker's start does; the gate's own
        # web tests set a window (tests/web/test_priorities.py).
        settings = load_settings(**{"cache_dir": tmp_path / "cache", "sse_keepalive_s": 1,
                                    "wait_timeout_s": 5, "queue_window": 0, **overrides})
        app = create_app(settings, store=store, celery_client=celery)
        app.testing = True
        return app
    return _make


@pytest.fixture
def client(make_app):
    return make_app().test_client()


def parse_sse(text: str, place_frames: bool = False) -> list[dict[str, Any]]:
    """SSE frames as dicts: {"id", "event", "data"} (comments and retry lines dropped; a queued
    job's place-in-line frames, ``queued`` without an ``id``, only with ``place_frames``)."""
    frames = []
    for block in text.split("\n\n"):
        frame: dict[str, Any] = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            name, _, value = line.partition(":")
            frame[name] = value[1:] if value.startswith(" ") else value
        if "data" in frame and (place_frames or "id" in frame or frame.get("event") != "queued"):
            frame["data"] = json.loads(frame["data"])
            frames.append(frame)
    return frames
