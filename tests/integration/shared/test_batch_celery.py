"""The Batch API from the celery CLI's side: ``miniserve.batch`` by name with a JSONL path
and with a list of bodies; ``miniserve.batch_summary`` returns the ended batch. The task is
an HTTP client of the web's /v1/files and /v1/batches (``MINISERVE_WEB_URL``), so a web runs
beside the worker: the shared stack's worker is started knowing its web's address
(tests/harness/served.py)."""
from __future__ import annotations

import json

import pytest
from celery import Celery

from celery.exceptions import CeleryError

from core.batches import BatchStore
from worker.batch_tasks import BATCH_START

pytestmark = pytest.mark.integration


@pytest.fixture
def client(served_shared):
    app = Celery("batch-test", broker=served_shared.stack.redis_url, backend=served_shared.stack.redis_url)
    yield app
    app.close()


def body(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 4}


def test_a_jsonl_path_runs_as_a_batch_and_the_summary_names_its_files(client, worker, store, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                                           "body": body("One?")}), "not json"]))
    started = client.send_task(BATCH_START, args=[str(path)], queue="bench").get(timeout=60)
    assert started["status"] == "validating" and started["request_counts"]["total"] == 0  # the web reads the lines after
    summary = client.AsyncResult(started["summary_task_id"]).get(timeout=120)
    assert summary["id"] == started["batch_id"] and summary["status"] == "completed"
    assert summary["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    files = BatchStore(store.client)
    [line] = [json.loads(x) for x in files.get_file(summary["output_file_id"]).content.splitlines()]
    assert line["custom_id"] == "a" and line["response"]["body"]["object"] == "chat.completion"
    [error] = [json.loads(x) for x in files.get_file(summary["error_file_id"]).content.splitlines()]
    assert error["error"]["code"] == "invalid_json_line"


def test_a_list_of_bodies_gets_numbered_custom_ids(client, worker):
    started = client.send_task(BATCH_START, args=[[body("A?"), body("B?")]], queue="bench").get(timeout=60)
    summary = client.AsyncResult(started["summary_task_id"]).get(timeout=120)
    assert summary["request_counts"] == {"total": 2, "completed": 2, "failed": 0}


def test_a_list_of_completion_bodies_with_the_endpoint(client, worker, store):
    bodies = [{"prompt": "Once upon a time", "max_tokens": 3}, {"prompt": ["a", "b"], "max_tokens": 2}]
    started = client.send_task(BATCH_START, args=[bodies], kwargs={"endpoint": "/v1/completions"},
                               queue="bench").get(timeout=60)
    summary = client.AsyncResult(started["summary_task_id"]).get(timeout=120)
    assert summary["endpoint"] == "/v1/completions" and summary["request_counts"]["completed"] == 2
    lines = [json.loads(x) for x in BatchStore(store.client).get_file(summary["output_file_id"]).content.splitlines()]
    assert [len(x["response"]["body"]["choices"]) for x in lines] == [1, 2]
    assert all(x["response"]["body"]["object"] == "text_completion" for x in lines)


def test_an_endpoint_the_web_refuses_fails_the_task_naming_the_field(client, worker):
    with pytest.raises((ValueError, CeleryError)) as refused:
        client.send_task(BATCH_START, args=[[body("A?")]], kwargs={"endpoint": "/v1/embeddings"},
                         queue="bench").get(timeout=60)
    assert "400" in str(refused.value) and "param endpoint" in str(refused.value)
