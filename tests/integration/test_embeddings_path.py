"""The embedding model on the full path: redis-server, a real Celery worker started with
``MINISERVE_MODEL=all-minilm-l6-v2`` (threads pool), and the web server. The clients people
use work unchanged: the ``openai`` SDK's ``embeddings.create`` (a string, a list, base64),
LangChain's ``OpenAIEmbeddings`` and the ``ollama`` client's ``embed``; the served vectors
are the in-process engine's."""
from __future__ import annotations

import base64

import numpy as np
import pytest
import requests
from celery import Celery

from core.model_source import EMBEDDING_MODEL
from core.settings import load_settings
from core.tasks import WEBHOOK_QUEUE
from core.workers import list_workers
from tests.harness.stack import wait_until
from tests.integration.conftest import started_web, wait_for_worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXTS = ["The cat sits on the mat.", "A kitten is resting on a rug.", "Stock markets fell sharply today."]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("embedding-cache")


@pytest.fixture(scope="module")
def served(shared_stack, shared_store, cache_dir):
    """One embedding worker (given the harness's default -Q: it must drop those queues) and the web."""
    worker = shared_stack.start_worker(name="emb", pool="threads", concurrency=4, MINISERVE_MODEL=EMBEDDING_MODEL,
                                       MINISERVE_CACHE_DIR=str(cache_dir))
    try:
        wait_for_worker(shared_store, loaded=False)
    except TimeoutError:
        worker.kill()
        raise AssertionError("embedding worker did not come up:\n" + worker.log()[-4000:])
    web, base = started_web(shared_stack)
    yield base, worker
    web.kill()  # teardown: no graceful stop is under test here
    worker.kill()  # teardown: no graceful stop is under test here


@pytest.fixture(scope="module")
def engine(served, cache_dir):
    """The same model in this process, to compare the served vectors with."""
    from engine.embedding.model import EmbeddingModel
    from engine.embedding.source import prepare_embedding_model

    return EmbeddingModel(prepare_embedding_model(load_settings(cache_dir=cache_dir)))


def reference(engine, texts):
    return engine.embed(engine.encode(texts, truncate=False)).numpy()


def close(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float((1 - (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)).max())


def test_openai_client_embeddings(served, engine):
    from openai import BadRequestError, OpenAI

    base, _ = served
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    one = client.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS[0])  # the SDK asks for base64 itself
    assert len(one.data) == 1 and len(one.data[0].embedding) == 384 and one.model == EMBEDDING_MODEL
    many = client.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS, encoding_format="float")
    assert [d.index for d in many.data] == [0, 1, 2]
    vectors = np.array([d.embedding for d in many.data])
    assert close(vectors, reference(engine, TEXTS)) < 1e-6
    # a batch of one and a batch of three can take different matmul kernels (oneDNN picks by
    # shape on some CPUs): the same vector, not always the same rounding
    assert close(vectors[0], np.array(one.data[0].embedding)) < 1e-6
    assert many.usage.prompt_tokens == sum(len(ids) for ids in engine.encode(TEXTS, truncate=False))
    raw = client.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS, encoding_format="base64")
    decoded = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw.data])
    assert np.array_equal(decoded, vectors.astype(np.float32))
    ids = engine.encode(TEXTS[:2], truncate=False)
    tokens = client.embeddings.create(model=EMBEDDING_MODEL, input=ids, encoding_format="float")
    assert close(np.array([d.embedding for d in tokens.data]), vectors[:2]) < 1e-6
    with pytest.raises(BadRequestError) as refused:
        client.embeddings.create(model=EMBEDDING_MODEL, input="word " * 300)
    assert refused.value.body["param"] == "input" and refused.value.body["code"] == "input_too_long"
    with pytest.raises(BadRequestError) as refused:
        client.embeddings.create(model=EMBEDDING_MODEL, input="x", dimensions=128)
    assert refused.value.body["param"] == "dimensions"


def test_langchain_openai_embeddings(served, engine):
    from langchain_openai import OpenAIEmbeddings

    base, _ = served
    # check_embedding_ctx_length=False: otherwise LangChain tokenizes with tiktoken (OpenAI's
    # vocabulary, downloaded on first use) and sends those ids, which are not this model's.
    embeddings = OpenAIEmbeddings(model=EMBEDDING_MODEL, base_url=f"{base}/v1", api_key="unused",
                                  check_embedding_ctx_length=False, max_retries=0)
    documents = embeddings.embed_documents(TEXTS)
    query = embeddings.embed_query(TEXTS[1])
    assert close(documents, reference(engine, TEXTS)) < 1e-6
    assert np.allclose(query, documents[1], atol=1e-7)
    scores = np.array(documents) @ np.array(query)
    assert scores.argsort()[::-1].tolist()[:2] == [1, 0]  # the cat sentence is nearest the kitten one


def test_ollama_client_embed(served, engine):
    import ollama

    base, _ = served
    client = ollama.Client(host=base, timeout=120)
    reply = client.embed(model=EMBEDDING_MODEL, input=TEXTS)
    assert reply.model == EMBEDDING_MODEL and reply.prompt_eval_count > 0
    assert close(reply.embeddings, reference(engine, TEXTS)) < 1e-6
    cut = client.embed(model=EMBEDDING_MODEL, input="word " * 300)  # Ollama truncates by default
    assert len(cut.embeddings[0]) == 384 and cut.prompt_eval_count == 256
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=EMBEDDING_MODEL, input="word " * 300, truncate=False)
    assert refused.value.status_code == 400 and "256" in refused.value.error


def test_the_embedding_worker_consumes_only_its_models_queue(served, shared_stack, shared_store):
    base, _ = served
    assert requests.post(f"{base}/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": "x"},
                         timeout=120).status_code == 200
    (worker,) = [w for w in list_workers(shared_store.client, 15) if w["info"].get("model_id") == EMBEDDING_MODEL]
    assert worker["info"]["model_kind"] == "embedding"
    app = Celery("miniserve-test-inspect", broker=shared_stack.redis_url)
    try:
        found: dict = {}
        wait_until(lambda: found.update(app.control.inspect(destination=[worker["info"]["node"]],
                                                            timeout=5).active_queues() or {}) or found,
                   60, what="the worker's queues")
    finally:
        app.close()
    # its model's queue, and the webhooks queue every worker consumes (core/webhooks.py); no shared queue
    assert sorted(q["name"] for q in found[worker["info"]["node"]]) == sorted([f"embedding.{EMBEDDING_MODEL}",
                                                                               WEBHOOK_QUEUE])
