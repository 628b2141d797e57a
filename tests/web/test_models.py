"""Several models per cluster, web side (fakeredis heartbeats): a request's ``model`` picks
the queue of a worker that serves it; unknown -> 404 model_not_found; known but no live
worker -> 503 with Retry-After; ``/v1/models`` lists what live workers serve."""
from __future__ import annotations

import time

import pytest

from core import keys, tasks
from core.model_source import DEFAULT_MODEL_NAME, model_id
from core.models import KNOWN_FOR_S, served
from core.workers import remove_worker, write_heartbeat
from tests.web.conftest import run_job

OTHER = "smol-135m"


def beat(redis_client, name: str, model: str, now: float | None = None) -> None:
    write_heartbeat(redis_client, name, {"model_id": model, "queue": keys.worker_queue(name)}, now=now)


def post_job(client, **body):
    return client.post("/jobs", json={"prompt": "hi", "max_new_tokens": 4, **body})


def test_model_ids_name_bundled_folders_gguf_files_and_hub_ids(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert model_id("default") == DEFAULT_MODEL_NAME
    assert model_id(str(folder)) == "my-model" and model_id(str(folder) + "/") == "my-model"
    assert model_id("/models/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"
    assert model_id("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_a_named_model_goes_to_its_own_queue_and_the_default_to_the_shared_one(client, celery, store,
                                                                                redis_client):
    beat(redis_client, "a@h:1", DEFAULT_MODEL_NAME)
    beat(redis_client, "b@h:1", OTHER)
    other = post_job(client, model=OTHER)
    assert other.status_code == 202, other.get_json()
    default = post_job(client)
    celery.runner = lambda job_id: run_job(store, job_id)  # /agent/run waits for its job: end it at once
    agent = client.post("/agent/run", json={"prompt": "2+2", "model": OTHER})
    assert [s["queue"] for s in celery.sent[:2]] == [f"generation.{OTHER}", "generation"]
    assert store.get(other.get_json()["id"]).request["model"] == OTHER
    assert store.get(other.get_json()["id"]).queue == f"generation.{OTHER}"  # a re-queue stays with the model
    assert store.get(default.get_json()["id"]).request["model"] == DEFAULT_MODEL_NAME
    assert agent.status_code == 200 and celery.sent[2]["name"] == tasks.AGENT
    assert celery.sent[2]["queue"] == f"agent.{OTHER}"
    assert client.get("/queues").get_json()["queues"][f"generation.{OTHER}"] == 0


def test_an_unknown_model_is_a_404_naming_the_field(client, redis_client, celery):
    beat(redis_client, "a@h:1", DEFAULT_MODEL_NAME)
    beat(redis_client, "b@h:1", OTHER)  # two models: a name neither answers to is unknown
    reply = post_job(client, model="gpt-4o")
    assert reply.status_code == 404
    assert f"'{DEFAULT_MODEL_NAME}', '{OTHER}'" in reply.get_json()["error"]["message"]
    assert reply.get_json()["error"]["code"] == "model_not_found"
    assert reply.get_json()["error"]["field"] == "model"
    chat = client.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
    assert chat.status_code == 404
    assert chat.get_json()["error"] | {"message": ""} == {"message": "", "type": "not_found_error", "param": "model",
                                                         "code": "model_not_found"}
    assert celery.sent == []


def test_a_model_whose_workers_are_gone_is_a_503_with_retry_after(client, redis_client, celery):
    beat(redis_client, "b@h:1", OTHER)
    assert post_job(client, model=OTHER).status_code == 202
    remove_worker(redis_client, "b@h:1")
    reply = post_job(client, model=OTHER)
    assert reply.status_code == 503 and reply.headers["Retry-After"] == "10"
    assert reply.get_json()["error"]["code"] == "model_unavailable"
    generate = client.post("/generate", json={"prompt": "x", "model": OTHER})
    assert generate.status_code == 503 and len(celery.sent) == 1


def test_the_webs_own_model_waits_for_its_first_worker_but_not_for_a_dead_one(client, redis_client):
    assert post_job(client).status_code == 202  # a starting cluster: the job waits in the queue
    beat(redis_client, "a@h:1", DEFAULT_MODEL_NAME)
    remove_worker(redis_client, "a@h:1")
    assert post_job(client).status_code == 503


def test_a_model_unseen_for_a_day_is_forgotten(redis_client):
    beat(redis_client, "b@h:1", OTHER, now=time.time() - KNOWN_FOR_S - 10)
    view = served(redis_client, DEFAULT_MODEL_NAME, alive_s=15)
    assert OTHER not in view.seen and OTHER not in view.live


def test_models_lists_every_model_a_live_worker_serves(client, redis_client):
    assert [m["id"] for m in client.get("/v1/models").get_json()["data"]] == [DEFAULT_MODEL_NAME]
    beat(redis_client, "a@h:1", DEFAULT_MODEL_NAME)
    beat(redis_client, "b@h:1", OTHER)
    cards = client.get("/v1/models").get_json()["data"]
    assert sorted(m["id"] for m in cards) == sorted([DEFAULT_MODEL_NAME, OTHER])
    assert {m["object"] for m in cards} == {"model"}
    remove_worker(redis_client, "a@h:1")
    assert [m["id"] for m in client.get("/v1/models").get_json()["data"]] == [OTHER]


@pytest.mark.parametrize("explicit", [True, False])
def test_no_model_named_means_the_webs_model_when_set_else_the_only_one_served(make_app, redis_client, celery,
                                                                               explicit):
    beat(redis_client, "b@h:1", OTHER)
    app = make_app(model="default") if explicit else make_app()
    reply = post_job(app.test_client())
    if explicit:  # MINISERVE_MODEL=default was set for the web: its model, never served yet, waits
        assert reply.status_code == 202 and celery.sent[0]["queue"] == "generation"
    else:
        assert reply.status_code == 202 and celery.sent[0]["queue"] == f"generation.{OTHER}"


def test_a_worker_silent_for_three_beats_no_longer_serves_but_is_still_listed(client, redis_client):
    beat(redis_client, "b@h:1", OTHER, now=time.time() - 20)  # ALIVE_S is 15; /workers shows 30 s
    assert post_job(client, model=OTHER).status_code == 503
    assert [w["name"] for w in client.get("/workers").get_json()["workers"]] == ["b@h:1"]


def chat(client, model=None):
    return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                     **({"model": model} if model is not None else {})})


@pytest.mark.parametrize("name", [None, "", "default", "gpt-4o-mini", "gpt-3.5-turbo", "anything:latest"])
def test_a_one_model_cluster_answers_any_name_with_its_model(client, redis_client, celery, store, name):
    beat(redis_client, "a@h:1", DEFAULT_MODEL_NAME)
    celery.runner = lambda job_id: run_job(store, job_id)  # the chat waits for its job: end it at once
    reply = chat(client, name) if name is not None else post_job(client)
    job_id = reply.headers.get("X-Job-Id") or reply.get_json()["id"]
    assert store.get(job_id).request["model"] == DEFAULT_MODEL_NAME
    assert celery.sent[-1]["queue"] == "generation"


def beat_with_aliases(redis_client, name: str, model: str, aliases: list[str]) -> None:
    write_heartbeat(redis_client, name, {"model_id": model, "model_aliases": aliases,
                                         "queue": keys.worker_queue(name)})


@pytest.mark.parametrize("name, expected", [
    ("default", DEFAULT_MODEL_NAME), ("qwen2.5-coder:0.5b", DEFAULT_MODEL_NAME),
    ("qwen2.5-coder-0.5b-instruct-q4_k_m", DEFAULT_MODEL_NAME), (f"{DEFAULT_MODEL_NAME}:latest", DEFAULT_MODEL_NAME),
    ("SMOL-135M", OTHER), ("tiny-chat", OTHER), ("tiny-chat:latest", OTHER), ("smollm2:135m", OTHER),
])
def test_with_two_models_a_name_routes_by_id_alias_or_ollama_tag(client, redis_client, celery, store, name, expected):
    beat(redis_client, "a@h:1", DEFAULT_MODEL_NAME)  # the client's web runs the bundled default: its aliases
    beat_with_aliases(redis_client, "b@h:1", OTHER, ["tiny-chat", "smollm2:135m"])
    job = store.get(post_job(client, model=name).get_json()["id"])
    assert job.request["model"] == expected
    assert celery.sent[-1]["queue"] == ("generation" if expected == DEFAULT_MODEL_NAME else f"generation.{OTHER}")
    for wrong in ("gpt-4o-mini", "tiny-chat:0.5b", "smol"):
        assert post_job(client, model=wrong).status_code == 404


def test_models_and_a_models_card_show_the_aliases(client, redis_client):
    beat(redis_client, "a@h:1", DEFAULT_MODEL_NAME)
    beat_with_aliases(redis_client, "b@h:1", OTHER, ["tiny-chat"])
    cards = {m["id"]: m for m in client.get("/v1/models").get_json()["data"]}
    assert cards[OTHER]["aliases"] == ["tiny-chat"]
    assert cards[DEFAULT_MODEL_NAME]["aliases"] == ["default", "qwen2.5-coder:0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m"]
    assert client.get("/v1/models/tiny-chat").get_json()["id"] == OTHER
    assert client.get("/v1/models/gpt-4o").status_code == 404


def test_the_aliases_setting_names_the_webs_own_model(make_app, redis_client, celery, store):
    app = make_app(model_aliases="team-model, ,coder")
    beat(redis_client, "b@h:1", OTHER)
    client = app.test_client()
    job = store.get(post_job(client, model="Coder").get_json()["id"])
    assert job.request["model"] == DEFAULT_MODEL_NAME and celery.sent[-1]["queue"] == "generation"


def test_a_model_whose_workers_are_gone_is_still_503_by_its_id_not_another_model(client, redis_client):
    beat(redis_client, "b@h:1", OTHER)
    remove_worker(redis_client, "b@h:1")  # the web's own model is the only one on offer now
    assert post_job(client, model=f"{OTHER}:latest").status_code == 503
    assert post_job(client, model="gpt-4o").status_code == 202


def test_a_name_finds_its_model_of_any_kind_and_any_other_name_the_only_one_of_the_kind(redis_client):
    write_heartbeat(redis_client, "e@h:1", {"model_id": "embedder", "model_kind": "embedding",
                                            "model_aliases": ["mini"], "queue": "q"})
    view = served(redis_client, DEFAULT_MODEL_NAME, alive_s=15)
    assert view.available("chat") == [DEFAULT_MODEL_NAME] and view.available("embedding") == ["embedder"]
    assert view.resolve("mini", False, "embedding") == "embedder"
    assert view.resolve("text-embedding-3-small", False, "embedding") == "embedder"  # the only one of its kind
    assert view.resolve("gpt-4o-mini", False) == DEFAULT_MODEL_NAME  # the only chat model
    assert view.resolve("mini", False) == "embedder"  # named: found; its kind is the caller's to refuse
    assert view.resolve(None, False, "embedding") == "embedder" and view.kind("embedder") == "embedding"


def test_a_batch_intake_reuses_one_cluster_view_for_a_second_and_a_request_never_does(make_app, monkeypatch):
    from web import models

    reads, clock = [], [100.0]
    monkeypatch.setattr(models, "_read_cluster_models", lambda: reads.append(clock[0]) or object())
    monkeypatch.setattr(models, "_clock", lambda: clock[0])
    with make_app().app_context():
        models.cluster_models(), models.cluster_models()
        assert len(reads) == 2                                   # no opt-in: every call reads
        models.reuse_cluster_views()
        first = models.cluster_models()
        clock[0] += models.VIEW_REUSE_S / 2
        assert models.cluster_models() is first and len(reads) == 3
        clock[0] += models.VIEW_REUSE_S
        assert models.cluster_models() is not first and len(reads) == 4
    with make_app().app_context():
        models.cluster_models()
        assert len(reads) == 5                                   # a new context starts fresh
