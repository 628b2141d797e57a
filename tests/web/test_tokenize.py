"""``/tokenize``, ``/detokenize`` (vLLM's shapes) and ``GET /v1/models/{id}`` on the tiny
model's tokenizer: the web's ids are the ids the worker builds (transformers' chat template
through engine/prompt.py)."""
from __future__ import annotations

import json

import pytest

from core.workers import write_heartbeat
from engine.prompt import build_prompt
from engine.types import GenerationRequest
from tests.tiny_model import make_tiny_model_dir

MESSAGES = [{"role": "system", "content": "Be brief. 数学 ∑"}, {"role": "user", "content": "Hello there, 你好"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-tokenize"), hidden_size=32, num_layers=1)


@pytest.fixture
def tclient(make_app, tiny_folder):
    return make_app(model=str(tiny_folder)).test_client()


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_folder))


def test_prompt_tokens_and_back(tclient, hf_tokenizer, tiny_folder):
    body = tclient.post("/tokenize", json={"model": tiny_folder.name, "prompt": "Hello there, 你好"}).get_json()
    assert body["tokens"] == hf_tokenizer.encode("Hello there, 你好")
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 4096
    assert body["token_strs"] is None
    back = tclient.post("/detokenize", json={"tokens": body["tokens"]}).get_json()
    assert back == {"prompt": "Hello there, 你好"}


def test_a_model_the_cluster_does_not_know_is_a_404_naming_model(tclient, redis_client):
    """``model`` picks whose tokenizer: with two models, a name neither answers to is refused,
    not ignored (one model answers any name: core/models.py)."""
    write_heartbeat(redis_client, "b@h:1", {"model_id": "other-model", "queue": "q"})
    for path, body in (("/tokenize", {"model": "m", "prompt": "x"}), ("/detokenize", {"model": "m", "tokens": [1]})):
        response = tclient.post(path, json=body)
        assert response.status_code == 404, response.get_json()
        assert response.get_json()["error"]["code"] == "model_not_found"
        assert response.get_json()["error"]["field"] == "model"


@pytest.mark.parametrize("tools", [None, [WEATHER]])
def test_messages_tokens_are_the_workers_prompt(tclient, hf_tokenizer, tools):
    body = tclient.post("/tokenize", json={"messages": MESSAGES, "tools": tools}).get_json()
    worker = build_prompt(hf_tokenizer, GenerationRequest(messages=MESSAGES, tools=tools))
    assert body["tokens"] == worker.ids and body["count"] == len(worker.ids)


def test_no_system_message_gets_the_templates_default_and_no_generation_prompt(tclient, hf_tokenizer):
    user = MESSAGES[1:]
    body = tclient.post("/tokenize", json={"messages": user, "add_generation_prompt": False,
                                           "return_token_strs": True}).get_json()
    text = hf_tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=False)
    assert body["tokens"] == hf_tokenizer.encode(text, add_special_tokens=False)
    assert len(body["token_strs"]) == body["count"]


@pytest.mark.parametrize("body, field", [
    ({"prompt": "a", "messages": MESSAGES}, "prompt"),
    ({}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": "a", "tools": [WEATHER]}, "tools"),
    ({"prompt": "a", "temperature": 1}, "temperature"),
    ({"messages": []}, "messages"),
])
def test_bad_tokenize_bodies_name_the_field(tclient, body, field):
    response = tclient.post("/tokenize", json=body)
    assert response.status_code == 422 and response.get_json()["error"]["field"] == field


@pytest.mark.parametrize("tokens, field", [([1, -1], "tokens.1"), ([1, 10**9], "tokens.1"), (["a"], "tokens.0"),
                                           ("12", "tokens")])
def test_bad_detokenize_bodies_name_the_field(tclient, tokens, field):
    response = tclient.post("/detokenize", json={"tokens": tokens})
    assert response.status_code == 422 and response.get_json()["error"]["field"] == field


def test_a_lone_surrogate_is_a_422_not_a_crash(tclient):
    """The tokenizer cannot take one (TypeError); the body guard refuses it first."""
    for body, field in [({"prompt": "a\ud800b"}, "prompt"),
                        ({"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages.0.content")]:
        response = tclient.post("/tokenize", data=json.dumps(body), content_type="application/json")
        assert response.status_code == 422 and response.get_json()["error"]["field"] == field


def test_without_a_tokenizer_it_is_a_503(make_app, tmp_path):
    client = make_app(model=str(tmp_path)).test_client()
    response = client.post("/tokenize", json={"prompt": "a"})
    assert response.status_code == 503 and response.get_json()["error"]["code"] == "tokenizer_unavailable"


def test_retrieve_the_served_model_and_404_for_others(client, redis_client):
    served = client.get("/v1/models").get_json()["data"][0]
    assert client.get(f"/v1/models/{served['id']}").get_json() == served
    assert client.get("/v1/models/gpt-4o").get_json() == served  # the only model answers any name
    write_heartbeat(redis_client, "b@h:1", {"model_id": "zz-other", "queue": "q"})
    missing = client.get("/v1/models/gpt-4o")
    assert missing.status_code == 404
    assert missing.get_json() == {"error": {"message": f"The model 'gpt-4o' does not exist; this cluster serves "
                                                       f"'{served['id']}', 'zz-other'", "type": "not_found_error",
                                            "param": "model", "code": "model_not_found"}}
