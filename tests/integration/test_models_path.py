"""Two models on one Redis: two Celery workers, each started with its own tiny random-weight
model (different configs and names), and one web server. Every request reaches a worker of
the model it names, ``/v1/models`` lists both, an unknown model is a 404 ``model_not_found``,
and once a model's only worker stops its requests get a 503 with ``Retry-After``."""
from __future__ import annotations

import pytest
import requests

from core import keys, tasks
from core.events import SUCCEEDED
from core.routing import ALIVE_S
from tests.harness.stack import wait_until
from tests.integration.conftest import (
    gen_request, started_workers_and_web, wait_for_worker, wait_terminal,
)
from tests.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.integration


SECOND_CONTEXT = 512


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    """Another architecture size and seed, so its answers differ from the first model's, and
    another tokenizer (a smaller vocabulary) and context, so the web must use each model's own."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny-beta", hidden_size=48, num_layers=1,
                               num_heads=4, num_kv_heads=1, seed=7, tie_word_embeddings=True, vocab_size=300,
                               config_extra={"max_position_embeddings": SECOND_CONTEXT})


def ask(base: str, store, model: str | None, i: int):
    body = {"prompt": f"question {i}", "max_new_tokens": 4, **({"model": model} if model else {})}
    reply = requests.post(f"{base}/jobs", json=body, timeout=15)
    assert reply.status_code == 202, reply.text
    return wait_terminal(store, reply.json()["id"], 90)


def test_two_models_each_request_reaches_its_model(stack, store, tiny_model, second_model, celery_client):
    first, second = tiny_model.name, second_model.name
    # wb also consumes the shared queues (the harness's default -Q): jobs for the first model
    # it takes are forwarded, never answered with its own model (worker/model_guard.py).
    # A heartbeat counts for 10 s here (two beats) instead of 30: once wb stops, the 503 comes
    # within that, not ALIVE_S, when wb's pool child leaves its last beat behind.
    (wa, wb), web_proc, base = started_workers_and_web(stack, store, {"name": "wa"}, {
        "name": "wb", "MINISERVE_MODEL": str(second_model), "MINISERVE_MODEL_ALIASES": "beta-chat,beta:1b"},
        MINISERVE_WORKER_MAX_AGE_S="10")
    try:
        listed = requests.get(f"{base}/v1/models", timeout=10).json()["data"]
        assert sorted(m["id"] for m in listed) == sorted([first, second])
        assert next(m for m in listed if m["id"] == second)["aliases"] == ["beta-chat", "beta:1b"]

        for i, model in enumerate([second, first, None, second, None, first, second]):
            job = ask(base, store, model, i)
            expected = model or first  # the web's MINISERVE_MODEL is the cluster's default
            assert job.state == SUCCEEDED, job.error
            assert job.result["model"] == expected and job.request["model"] == expected
            assert job.worker.startswith("wb@" if expected == second else "wa@")

        chat = requests.post(f"{base}/v1/chat/completions", timeout=60, json={
            "model": second, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
        assert chat.status_code == 200, chat.text
        assert chat.json()["model"] == second and store.get(chat.headers["X-Job-Id"]).worker.startswith("wb@")

        unknown = requests.post(f"{base}/v1/chat/completions", timeout=10, json={
            "model": "no-such-model", "messages": [{"role": "user", "content": "hello"}]})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        assert repr(first) in unknown.json()["error"]["message"] and repr(second) in unknown.json()["error"]["message"]
        for alias in ("beta-chat", "BETA:1b", f"{second}:latest"):  # an alias or Ollama-style name reaches its model
            assert ask(base, store, alias, 50).result["model"] == second

        check_each_model_has_its_own_tokenizer(base, tiny_model, second_model)
        check_a_misdelivered_job_is_forwarded(store, celery_client, first, wb)

        wb.stop()  # its heartbeat goes at once, or within ALIVE_S when the pool child leaves it behind
        gone = requests.post(f"{base}/jobs", json={"prompt": "x", "model": second}, timeout=10)
        if gone.status_code == 202:
            wait_until(lambda: requests.post(f"{base}/jobs", json={"prompt": "x", "model": second},
                                             timeout=10).status_code == 503, ALIVE_S + 10, what="the 503")
            gone = requests.post(f"{base}/jobs", json={"prompt": "x", "model": second}, timeout=10)
        assert gone.status_code == 503 and gone.json()["error"]["code"] == "model_unavailable"
        assert int(gone.headers["Retry-After"]) > 0
        assert [m["id"] for m in requests.get(f"{base}/v1/models", timeout=10).json()["data"]] == [first]
        assert ask(base, store, first, 99).result["model"] == first
    finally:  # teardown: no graceful stop is under test here
        for proc in (web_proc, wa, wb):
            proc.kill()


def check_a_misdelivered_job_is_forwarded(store, celery_client, first: str, wb) -> None:
    """A job for the first model sent straight to wb's own queue runs on wa, not wb."""
    node = next(w["info"]["node"] for w in wait_for_worker(store, 2) if w["name"].startswith("wb@"))
    record = store.create("generate", "generation", {**gen_request(max_new_tokens=4), "model": first})
    celery_client.send_task(tasks.GENERATE, args=[record.id, 0], task_id=record.id, queue=keys.worker_queue(node))
    store.mark_dispatched(record.id)
    done = wait_terminal(store, record.id, 60)
    assert done.state == SUCCEEDED and done.result["model"] == first and done.worker.startswith("wa@")
    assert '"job_forwarded"' in wb.log()


def check_each_model_has_its_own_tokenizer(base: str, first_folder, second_folder) -> None:
    """The web (whose own model is the first) counts and tokenizes the second model's prompts
    with the tokenizer its worker published, and checks them against its context."""
    from transformers import AutoTokenizer

    text = "Hello there, 你好, copy-on-write queues"
    answers = {}
    for folder in (first_folder, second_folder):
        wait_until(lambda folder=folder: requests.post(f"{base}/tokenize", json={"model": folder.name, "prompt": text},
                                                        timeout=10).status_code == 200, 30, what="published tokenizer")
        body = requests.post(f"{base}/tokenize", json={"model": folder.name, "prompt": text}, timeout=10).json()
        assert body["tokens"] == AutoTokenizer.from_pretrained(str(folder)).encode(text)
        answers[folder.name] = body
    assert answers[first_folder.name]["tokens"] != answers[second_folder.name]["tokens"]
    assert answers[second_folder.name]["max_model_len"] == SECOND_CONTEXT
    assert answers[first_folder.name]["max_model_len"] == 4096
    body = {"prompt": "queue " * 3, "max_new_tokens": SECOND_CONTEXT - 20}
    refused = requests.post(f"{base}/jobs", json={**body, "model": second_folder.name}, timeout=10)
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "context_exceeded"
    assert str(SECOND_CONTEXT) in refused.json()["error"]["message"]
