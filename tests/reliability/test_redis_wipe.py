"""Redis restarting *without* persistence (empty): accepted jobs are gone (404), but new jobs
submitted right after the restart must still reach a worker."""
from __future__ import annotations

import pytest
import redis
import requests

from core.events import SUCCEEDED
from core.jobs import JobStore
from tests.harness.stack import Stack, free_port
from tests.integration.conftest import WORKER_ENV, started_workers_and_web, wait_terminal
from tests.reliability.conftest import RestartableRedis

pytestmark = pytest.mark.integration
SHORT = {"prompt": "after a wipe", "max_new_tokens": 8}


def test_new_jobs_reach_the_worker_after_redis_restarts_empty(tmp_path, tiny_model):
    server = RestartableRedis(tmp_path, free_port(), appendonly=False)
    server.start()
    stack = Stack(redis_url=server.url, env_overrides={**WORKER_ENV, "MINISERVE_MODEL": str(tiny_model),
                                                       "MINISERVE_WEB_WORKERS": "1"})
    store = JobStore(redis.Redis.from_url(server.url, decode_responses=True))
    (worker,), web_proc, base = started_workers_and_web(stack, store, {})
    try:
        first = requests.post(f"{base}/jobs", json=SHORT, timeout=10).json()["id"]
        assert wait_terminal(store, first, 60).state == SUCCEEDED
        server.stop()
        server.start()
        assert requests.get(f"{base}/jobs/{first}", timeout=10).status_code == 404  # no persistence: gone
        after = requests.post(f"{base}/jobs", json=SHORT, timeout=10)
        assert after.status_code == 202, after.text
        record = wait_terminal(store, after.json()["id"], 60)  # its message reached the queue and a worker
        assert record.state == SUCCEEDED and worker.popen.poll() is None
    finally:  # teardown: no graceful stop is under test here
        web_proc.kill()
        worker.kill()
        if server.proc:
            server.proc.kill()
