"""The embedding routes, web side (fakeredis, a fake worker that answers the job): the job's
queue and stored request, both answer shapes, and every refusal as a 400 naming its field."""
from __future__ import annotations

import base64
import struct

import pytest

from core import keys, tasks
from core.events import FAILED
from core.model_source import DEFAULT_MODEL_NAME
from core.workers import write_heartbeat
from tests.web.conftest import run_job

EMBEDDER = "all-minilm-l6-v2"
VECTORS = [[0.5, -0.25, 1.0], [0.125, 0.0, -2.0]]


def b64(vector):
    return base64.b64encode(struct.pack("<%df" % len(vector), *vector)).decode()


def beat(redis_client, name: str, model: str, kind: str) -> None:
    write_heartbeat(redis_client, name, {"model_id": model, "model_kind": kind, "queue": keys.worker_queue(name)})


@pytest.fixture
def cluster(redis_client, celery, store):
    """A chat worker and an embedding worker; the fake worker answers each embedding job with
    one vector per input (or the failure set in ``failure``)."""
    beat(redis_client, "chat@h:1", DEFAULT_MODEL_NAME, "chat")
    beat(redis_client, "emb@h:1", EMBEDDER, "embedding")
    failure: dict = {}

    def answer(job_id: str) -> None:
        request = store.get(job_id).request
        count = len(request.get("texts") or request.get("token_ids"))
        if failure:
            run_job(store, job_id, chunks=(), state=FAILED, payload=failure)
            return
        run_job(store, job_id, chunks=(), payload={
            "model": EMBEDDER, "embeddings": [b64(VECTORS[i % 2]) for i in range(count)], "dimensions": 3,
            "usage": {"prompt_tokens": 4 * count, "total_tokens": 4 * count},
            "timings": {"load_ms": 1.5, "embed_ms": 2.0, "forwards": 1}})
    celery.runner = answer
    return failure


def test_a_string_list_becomes_one_job_on_the_models_embedding_queue(client, celery, store, cluster):
    reply = client.post("/v1/embeddings", json={"model": EMBEDDER, "input": ["a", "b"], "user": "u1"})
    assert reply.status_code == 200, reply.get_json()
    body = reply.get_json()
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert [d["embedding"] for d in body["data"]] == VECTORS
    assert body["object"] == "list" and body["model"] == EMBEDDER
    assert body["usage"] == {"prompt_tokens": 8, "total_tokens": 8}
    (sent,) = celery.sent
    assert sent["name"] == tasks.EMBED and sent["queue"] == f"embedding.{EMBEDDER}"
    job = store.get(reply.headers["X-Job-Id"])
    assert job.type == "embedding" and job.request == {"texts": ["a", "b"], "truncate": False, "model": EMBEDDER,
                                                  "priority": "interactive"}


def test_base64_returns_the_stored_float32_bytes(client, cluster):
    body = client.post("/v1/embeddings", json={"model": EMBEDDER, "input": "a", "encoding_format": "base64"}).get_json()
    assert body["data"][0]["embedding"] == b64(VECTORS[0])


@pytest.mark.parametrize("given, stored", [
    ([101, 7592, 102], {"token_ids": [[101, 7592, 102]]}),
    ([[101, 102], [101, 7, 102]], {"token_ids": [[101, 102], [101, 7, 102]]}),
    ("hi", {"texts": ["hi"]}),
])
def test_token_arrays_are_stored_as_token_ids(client, store, cluster, given, stored):
    reply = client.post("/v1/embeddings", json={"model": EMBEDDER, "input": given})
    assert reply.status_code == 200
    request = store.get(reply.headers["X-Job-Id"]).request
    assert {k: v for k, v in request.items() if k in ("texts", "token_ids")} == stored


@pytest.mark.parametrize("body, field", [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": ["a", ""]}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [-1, 3]}, "input"),
    ({"input": ["a", 1]}, "input"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "truncate": True}, "truncate"),
    ({"input": "a", "model": DEFAULT_MODEL_NAME}, "model"),
    ({"input": "a", "model": "nope"}, "model"),
])
def test_bad_requests_are_400s_naming_the_field_and_queue_nothing(client, celery, cluster, body, field):
    reply = client.post("/v1/embeddings", json={"model": EMBEDDER, **body})
    assert reply.status_code in (400, 404), reply.get_json()
    assert reply.get_json()["error"]["param"] == field
    assert celery.sent == []


def test_too_many_inputs_is_a_400(make_app, celery, cluster):
    client = make_app(embedding_max_inputs=3).test_client()
    reply = client.post("/v1/embeddings", json={"model": EMBEDDER, "input": ["a"] * 4})
    assert reply.status_code == 400 and reply.get_json()["error"]["code"] == "too_many_inputs"
    assert celery.sent == []


def test_an_input_the_worker_refuses_is_a_400_naming_input(client, cluster):
    cluster.update({"code": "input_too_long", "message": "input[0] has 300 tokens; this model reads at most 256",
                    "field": "input", "index": 0})
    reply = client.post("/v1/embeddings", json={"model": EMBEDDER, "input": "long"})
    assert reply.status_code == 400
    assert reply.get_json()["error"] | {"message": ""} == {"message": "", "type": "invalid_request_error",
                                                           "param": "input", "code": "input_too_long"}


def test_dimensions_other_than_the_models_is_a_400_naming_dimensions(client, cluster):
    cluster.update({"code": "unsupported_dimensions", "message": "dimensions: 384 only", "field": "dimensions"})
    reply = client.post("/v1/embeddings", json={"model": EMBEDDER, "input": "a", "dimensions": 64})
    assert reply.status_code == 400 and reply.get_json()["error"]["param"] == "dimensions"


def test_no_model_means_the_only_embedding_model(client, cluster):
    reply = client.post("/v1/embeddings", json={"input": "a"})
    assert reply.status_code == 200 and reply.get_json()["model"] == EMBEDDER


def test_an_embedding_model_on_the_chat_routes_is_a_400(client, celery, cluster):
    chat = client.post("/v1/chat/completions", json={"model": EMBEDDER, "messages": [{"role": "user", "content": "x"}]})
    assert chat.status_code == 400 and chat.get_json()["error"]["param"] == "model"
    job = client.post("/jobs", json={"prompt": "x", "model": EMBEDDER})
    assert job.status_code == 400 and job.get_json()["error"]["code"] == "embedding_model"
    assert celery.sent == []


def test_ollama_embed_answers_in_ollamas_shape(client, store, cluster):
    reply = client.post("/api/embed", json={"model": EMBEDDER, "input": ["a", "b"], "keep_alive": "5m"})
    assert reply.status_code == 200, reply.get_json()
    body = reply.get_json()
    assert body["embeddings"] == VECTORS and body["model"] == EMBEDDER and body["prompt_eval_count"] == 8
    assert body["load_duration"] == 1_500_000 and body["total_duration"] > 0
    assert store.get(reply.headers["X-Job-Id"]).request["truncate"] is True  # Ollama's default


@pytest.mark.parametrize("body, message", [
    ({"input": "a", "options": {"temperature": 0.1}}, "options.temperature"),
    ({"input": 3}, "input"),
    ({"input": "a", "model": DEFAULT_MODEL_NAME}, "model"),
    ({"input": "a", "format": "json"}, "format"),
])
def test_ollama_embed_errors_are_ollamas_shape(client, celery, cluster, body, message):
    reply = client.post("/api/embed", json={"model": EMBEDDER, **body})
    assert reply.status_code == 400
    assert set(reply.get_json()) == {"error"} and reply.get_json()["error"].startswith(message)
    assert celery.sent == []
