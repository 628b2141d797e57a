"""``/health`` is readiness (a live worker with its model loaded), ``/healthz`` liveness."""
from __future__ import annotations

import time

from core.workers import write_heartbeat
from tests.web.test_system import _down_app


def test_not_ready_without_workers(client):
    response = client.get("/health")
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    body = response.get_json()
    assert body["status"] == "not_ready" and body["reason"] == "no_workers" and body["workers"] == 0
    assert client.get("/healthz").status_code == 200  # alive, just not ready


def test_not_ready_while_the_model_loads(client, redis_client):
    write_heartbeat(redis_client, "w1@host", {"pid": 12, "engine_loaded": False, "model": "m"})
    body = client.get("/health").get_json()
    assert body["reason"] == "model_not_loaded" and body["workers"] == 1 and body["ready_workers"] == 0


def test_a_model_that_failed_to_load_is_its_own_reason(client, redis_client):
    write_heartbeat(redis_client, "w1@host", {"engine_loaded": False, "model": "m", "load_error": "no such file: m.gguf"})
    body = client.get("/health").get_json()
    assert body["reason"] == "model_failed" and body["load_errors"] == [{"model": "m", "error": "no such file: m.gguf"}]
    write_heartbeat(redis_client, "w2@host", {"engine_loaded": False, "model": "m"})  # another still loading
    assert client.get("/health").get_json()["reason"] == "model_not_loaded"


def test_ready_with_one_loaded_worker(client, redis_client):
    write_heartbeat(redis_client, "w1@host", {"pid": 12, "engine_loaded": False, "model": "m"})
    write_heartbeat(redis_client, "w2@host", {"pid": 13, "engine_loaded": True, "model": "m"})
    response = client.get("/health")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ready", "reason": None, "message": None, "workers": 2,
                                   "ready_workers": 1, "models": ["m"]}


def test_a_stale_loaded_worker_does_not_count(client, redis_client):
    write_heartbeat(redis_client, "gone@host", {"engine_loaded": True}, now=time.time() - 300)
    assert client.get("/health").get_json()["reason"] == "no_workers"


def test_redis_down_is_not_ready(tmp_path):
    from core.settings import load_settings
    client, _ = _down_app(load_settings(cache_dir=tmp_path))
    response = client.get("/health")
    assert response.status_code == 503 and response.get_json()["reason"] == "redis_unavailable"


def test_health_needs_no_key(make_app, redis_client):
    client = make_app(api_keys=["k" * 32]).test_client()
    write_heartbeat(redis_client, "w1@host", {"engine_loaded": True})
    assert client.get("/health").status_code == 200
    assert client.get("/workers").status_code == 401
