"""A web process SIGKILLed while it reads a batch's input: another web fails the batch
(``validation_interrupted``) once its intake has made no progress for
``MINISERVE_BATCH_INTAKE_STALE_S``, and cancels every job the batch had queued. No worker
runs, so each queued job is still open when the batch fails: every one must end cancelled."""
from __future__ import annotations

import json

import requests

from core import keys
from core.batches import BatchStore
from core.events import CANCELLED
from tests.harness.stack import wait_until
from tests.integration.conftest import started_web

LINES = 20_000  # far more than the intake reads before the kill (it is killed after its first chunk)
ENV = {"MINISERVE_BATCH_INTAKE_STALE_S": "2", "MINISERVE_MAX_QUEUE_DEPTH": "0", "MINISERVE_WEB_WORKERS": "1"}


def jsonl(count: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"messages": [{"role": "user", "content": f"Line {i}?"}], "max_tokens": 4}})
                   + "\n" for i in range(count)).encode()


def test_a_web_killed_mid_intake_leaves_a_batch_another_web_fails_and_no_open_job(stack, store):
    first, base = started_web(stack, **ENV)
    try:
        file_id = requests.post(f"{base}/v1/files", data={"purpose": "batch"},
                                files={"file": ("in.jsonl", jsonl(LINES))}, timeout=60).json()["id"]
        batch = requests.post(f"{base}/v1/batches", json={"input_file_id": file_id, "completion_window": "24h",
                                                          "endpoint": "/v1/chat/completions"}, timeout=30).json()
        assert batch["status"] == "validating", batch
        entries_key = keys.batch_entries_key(batch["id"])
        wait_until(lambda: store.client.llen(entries_key) > 0, 60, interval_s=0.02, what="the intake's first chunk")
    finally:
        first.kill()  # SIGKILL: the intake dies with its process
    read = store.client.llen(entries_key)
    assert 0 < read < LINES
    second, base = started_web(stack, **ENV)
    try:
        def batch_now() -> dict:
            return requests.get(f"{base}/v1/batches/{batch['id']}", timeout=30).json()

        wait_until(lambda: batch_now()["status"] != "validating", 60, interval_s=0.2, what="the stale batch to end")
        ended = batch_now()
    finally:
        second.kill()
    assert ended["status"] == "failed" and ended["failed_at"]
    assert [e["code"] for e in ended["errors"]["data"]] == ["validation_interrupted"]
    entries = BatchStore(store.client).entries(batch["id"])
    assert len(entries) == read and [e["custom_id"] for e in entries] == [f"r{i}" for i in range(read)]
    assert {store.get(e["job_id"]).state for e in entries} == {CANCELLED}
