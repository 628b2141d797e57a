"""Health, workers and queues; Redis down -> 503 JSON; the web never imports torch."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from core import keys
from core.jobs import JobStore
from core.workers import list_workers, remove_worker, write_heartbeat
from tests.harness.bounded import returns
from tests.web.conftest import FakeCelery

ROOT = Path(__file__).resolve().parents[2]


def test_healthz_without_and_with_workers(client, redis_client):
    assert client.get("/healthz").get_json() == {"status": "no_workers", "redis": True, "workers": 0}
    write_heartbeat(redis_client, "w1@host", {"pid": 12, "queues": ["generation"]})
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok", "redis": True, "workers": 1}


def test_workers_lists_fresh_heartbeats_only(client, redis_client):
    write_heartbeat(redis_client, "old", {"pid": 1}, now=time.time() - 300)
    write_heartbeat(redis_client, "new", {"pid": 2, "cache": {"prefix_hits": 3}})
    workers = client.get("/workers").get_json()["workers"]
    assert [w["name"] for w in workers] == ["new"]
    assert workers[0]["info"] == {"pid": 2, "cache": {"prefix_hits": 3}}
    assert 0 <= workers[0]["age_s"] < 30  # fresh (the old one was 300 s old, and is pruned)
    assert redis_client.zscore(keys.WORKERS_INDEX, "old") is None  # pruned
    remove_worker(redis_client, "new")
    assert list_workers(redis_client, 30) == []


def test_queues_reports_depth_per_queue(client, redis_client):
    redis_client.lpush(keys.queue_key("generation"), "m1", "m2")
    body = client.get("/queues").get_json()
    assert body["queues"] == {"generation": 2, "agent": 0, "bench": 0}
    assert body["max_queue_depth"] == 1000


def _down_app(make_settings):
    from web import create_app
    dead = redis.Redis(host="127.0.0.1", port=1, decode_responses=True, socket_connect_timeout=0.5,
                       retry=Retry(NoBackoff(), 0))
    celery = FakeCelery()
    app = create_app(make_settings, store=JobStore(dead), celery_client=celery)
    return app.test_client(), celery


def test_redis_down_is_503_json_with_retry_after(tmp_path):
    from core.settings import load_settings
    client, celery = _down_app(load_settings(cache_dir=tmp_path))
    for method, path, kwargs in [("post", "/jobs", {"json": {"prompt": "hi"}}), ("get", "/jobs", {}),
                                 ("get", "/jobs/" + "0" * 32, {}), ("get", "/queues", {}), ("get", "/workers", {}),
                                 ("post", "/generate", {"json": {"prompt": "hi"}})]:
        response = getattr(client, method)(path, **kwargs)
        assert response.status_code == 503, path
        assert response.get_json()["error"]["code"] == "redis_unavailable"
        assert response.headers["Retry-After"] == "5"
    health = client.get("/healthz")
    assert health.status_code == 503 and health.get_json()["redis"] is False
    assert celery.sent == []


def test_web_import_and_app_creation_do_not_load_torch_or_engine():
    code = ("import sys, fakeredis\n"
            "from core.jobs import JobStore\nfrom core.settings import load_settings\n"
            "from web import create_app\nimport web.__main__\n"
            "app = create_app(load_settings(), store=JobStore(fakeredis.FakeRedis(decode_responses=True)))\n"
            "app.test_client().get('/openapi.json')\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'engine', 'transformers'))]\n"
            "assert not bad, bad\nprint('clean')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"


def test_docs_are_served_offline(client):
    page = client.get("/docs")
    assert page.status_code == 200 and b"swagger-ui" in page.data
    assert b"http" not in page.data.split(b"<script>")[0]  # no CDN links for assets
    assert client.get("/swagger/css/swagger-ui.css").status_code == 200
    assert client.get("/swagger/js/swagger-ui-bundle.js").status_code == 200
    spec = client.get("/openapi.json").get_json()
    assert set(spec["paths"]) >= {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/cancel", "/jobs/{job_id}/events",
                                  "/generate", "/agent/run", "/healthz", "/workers", "/queues"}


def test_broker_down_with_store_up_is_503_fast_and_the_job_is_not_left_queued(make_app, store, tmp_path):
    from core.settings import load_settings
    from web import create_app
    from web.celery_client import make_celery_client
    settings = load_settings(redis_url="redis://127.0.0.1:1/0", cache_dir=tmp_path)
    client = create_app(settings, store=store, celery_client=make_celery_client(settings)).test_client()
    response = returns(lambda: client.post("/jobs", json={"prompt": "hi"}))
    assert response.status_code == 503 and response.get_json()["error"]["code"] == "redis_unavailable"
    [job] = store.list()
    assert job.state == "failed" and job.error["code"] == "enqueue_failed"


def test_server_options_bind_localhost_with_gevent_workers_and_no_debug(client):
    from core.settings import load_settings
    from web.__main__ import gunicorn_options
    options = gunicorn_options(load_settings(web_connections=1234, header_timeout_s=7))
    assert options["bind"] == "127.0.0.1:8000"
    from gunicorn.workers.ggevent import GeventWorker
    from gunicorn.util import load_class
    assert issubclass(load_class(options["worker_class"]), GeventWorker)
    assert options["worker_connections"] == 1234 and options["keepalive"] == 7 and "threads" not in options
    assert client.application.debug is False


def test_a_full_redis_is_a_503_store_full_not_a_500(client, store, monkeypatch):
    """``noeviction`` at maxmemory refuses writes with an OOM error: the web says full, retry later."""
    import redis as redis_lib

    def full(*_args, **_kwargs):
        raise redis_lib.exceptions.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'.")

    monkeypatch.setattr(store, "create", full)
    response = client.post("/jobs", json={"prompt": "hi"})
    assert response.status_code == 503 and response.get_json()["error"]["code"] == "store_full"
    assert int(response.headers["Retry-After"]) > 0
