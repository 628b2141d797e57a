"""The official ``openai`` client's Files and Batches calls, unchanged, against the real stack
(redis-server, a Celery worker on the tiny model, gunicorn web), and cancel-on-disconnect of
waiting requests over a raw socket."""
from __future__ import annotations

import io
import json
import socket
import time
from urllib.parse import urlparse

import openai
import pytest
from openai.types import Batch, FileObject
from openai.types.chat import ChatCompletion

from core.events import TERMINAL_STATES
from tests.harness.stack import wait_until


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def request_line(custom_id: str, content: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": content}],
                                "max_tokens": 6, **body}})


def test_files_and_batches_through_the_openai_client(client):
    lines = [request_line(f"q{i}", f"Question number {i}?") for i in range(4)]
    lines.insert(2, request_line("bad", "Hi", store=True))
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    assert isinstance(uploaded, FileObject) and uploaded.purpose == "batch"
    assert client.files.retrieve(uploaded.id).bytes == uploaded.bytes
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"suite": "surface"})
    assert isinstance(batch, Batch) and batch.status == "validating" and batch.metadata == {"suite": "surface"}
    deadline = time.monotonic() + 90
    while batch.status not in ("completed", "failed", "cancelled", "expired") and time.monotonic() < deadline:
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts.total == 5 and batch.request_counts.completed == 4 and batch.request_counts.failed == 1
    output = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in output] == ["q0", "q1", "q2", "q3"]
    for item in output:
        assert item["error"] is None and item["response"]["status_code"] == 200
        completion = ChatCompletion.model_validate(item["response"]["body"])
        assert completion.usage.completion_tokens <= 6
    [error] = [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["param"] == "store"
    assert batch.id in [b.id for b in client.batches.list(limit=5).data]


def test_the_batch_answers_equal_the_synchronous_ones(client, served_model):
    """Same request, same path: greedy answers of a batch line and of a direct call agree."""
    text = request_line("one", "Tell me a colour.")
    uploaded = client.files.create(file=("one.jsonl", io.BytesIO(text.encode())), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).status == "completed", 60, interval_s=0.5,
               what="the batch to complete")
    done = client.batches.retrieve(batch.id)
    [line] = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    direct = client.chat.completions.create(model=served_model, messages=[{"role": "user", "content": "Tell me a colour."}],
                                            max_tokens=6)
    assert line["response"]["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
    assert line["response"]["body"]["model"] == direct.model == served_model


def test_a_batch_cancelled_through_the_client_ends_cancelled(client):
    lines = [request_line(f"c{i}", f"Long answer {i}", max_tokens=2000, stop=["<never>"]) for i in range(3)]
    uploaded = client.files.create(file=("c.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    wait_until(lambda: client.batches.retrieve(batch.id).status == "cancelled", 60, interval_s=0.5,
               what="the batch to be cancelled")
    done = client.batches.retrieve(batch.id)
    # cancelled while validating or after: no line may complete, and a line read after the
    # cancel is never left running (the intake withdraws it)
    assert done.request_counts.completed == 0 and done.output_file_id is None


def _post_and_close(base_url: str, path: str, body: dict, surface_store, job_type: str) -> str:
    """Send a waiting request over a raw socket, close it once its job streams tokens; the job id."""
    url = urlparse(base_url)
    data = json.dumps(body).encode()
    before = {j.id for j in surface_store.list(limit=20)}
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)

    def new_job():
        fresh = [j for j in surface_store.list(limit=20) if j.id not in before and j.type == job_type]
        return fresh[0] if fresh else None

    wait_until(lambda: (j := new_job()) is not None and j.last_seq >= 3, 30, what="the job to stream tokens")
    job_id = new_job().id
    sock.close()
    wait_until(lambda: surface_store.get(job_id).state in TERMINAL_STATES, 30, what="the job to end")
    return job_id


@pytest.mark.parametrize("path, job_type, body", [
    ("/generate", "generate", {"prompt": "Count slowly", "max_new_tokens": 2000, "stop": ["<never>"]}),
    ("/v1/chat/completions", "chat", {"messages": [{"role": "user", "content": "Count slowly"}],
                                      "max_tokens": 2000, "stop": ["<never>"]}),
])
def test_a_client_that_leaves_a_waiting_request_cancels_its_job(base_url, surface_store, path, job_type, body):
    job_id = _post_and_close(base_url, path, body, surface_store, job_type)
    job = surface_store.get(job_id)
    assert job.state == "cancelled", job.state
    assert job.error["partial"]["usage"]["completion_tokens"] < 2000
