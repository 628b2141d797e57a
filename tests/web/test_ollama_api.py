"""The Ollama API (``/api``) on fakeredis with a fake worker: the chat/completion job each
request becomes (the same one ``/v1`` builds), options and refusals (a 400 naming the field,
in Ollama's ``{"error": "..."}`` shape), replies and NDJSON lines read with the ``ollama``
client's own types, and the catalogue routes."""
from __future__ import annotations

import json

import pytest
from ollama import ChatResponse, GenerateResponse, ListResponse, ProcessResponse, ShowResponse

from core.model_source import DEFAULT_MODEL_NAME
from core.workers import write_heartbeat
from tests.tiny_model import make_tiny_model_dir
from tests.web.conftest import run_job

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
RESULT = {"finish_reason": "stop", "method": "paged",
          "usage": {"prompt_tokens": 9, "completion_tokens": 2, "cached_tokens": 0},
          "timings": {"ttft_s": 0.25, "total_s": 1.0, "decode_tokens_per_s": 2.0}}


def worker_says(store, celery, chunks, finish="stop"):
    payload = {**RESULT, "text": "".join(chunks), "finish_reason": finish}
    celery.runner = lambda job_id: run_job(store, job_id, chunks=chunks, payload=payload)


def ndjson(response) -> list[dict]:
    assert response.mimetype == "application/x-ndjson"
    return [json.loads(line) for line in response.get_data(as_text=True).splitlines()]


def chat(client, **body):
    return client.post("/api/chat", json={"model": "qwen2.5-coder:0.5b", "messages": USER, **body})


def test_chat_runs_the_same_chat_job_and_answers_in_ollamas_shape(client, store, celery):
    worker_says(store, celery, ["Sunny", " today"])
    reply = chat(client, stream=False, keep_alive="5m", think=False,
                 options={"temperature": 0.5, "top_p": 0.9, "top_k": 7, "num_predict": 12, "seed": 3,
                          "stop": ["\n\n"], "repeat_penalty": 1.2, "min_p": 0.05})
    assert reply.status_code == 200, reply.get_json()
    body = ChatResponse(**reply.get_json())  # the client's own type
    assert body.message.role == "assistant" and body.message.content == "Sunny today"
    assert body.done and body.done_reason == "stop" and body.model == DEFAULT_MODEL_NAME
    assert (body.prompt_eval_count, body.eval_count) == (9, 2)
    assert (body.prompt_eval_duration, body.eval_duration, body.load_duration) == (250_000_000, 750_000_000, 0)
    assert body.total_duration > 0 and body.created_at.endswith("Z")
    job = store.get(reply.headers["X-Job-Id"])
    assert job.type == "chat" and job.request["messages"] == USER and job.request["model"] == DEFAULT_MODEL_NAME
    assert job.request["sampling"] | {} == {**job.request["sampling"], "max_new_tokens": 12, "temperature": 0.5,
                                            "top_p": 0.9, "top_k": 7, "seed": 3, "stop": ["\n\n"],
                                            "repetition_penalty": 1.2, "min_p": 0.05}


def test_chat_streams_ndjson_by_default(client, store, celery):
    worker_says(store, celery, ["Sun", "ny"], finish="length")
    lines = ndjson(chat(client))
    parts = [ChatResponse(**line) for line in lines]
    assert [p.message.content for p in parts if not p.done] == ["Sun", "ny"]
    assert [p.done for p in parts] == [False, False, True]
    last = parts[-1]
    assert last.done_reason == "length" and last.eval_count == 2 and last.message.content == ""
    assert "done_reason" not in lines[0]


def test_messages_with_tool_calls_and_tool_results_become_the_chat_jobs_messages(client, store, celery):
    worker_says(store, celery, ["It is sunny."])
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    reply = chat(client, messages=messages, tools=[WEATHER_TOOL], stream=False)
    assert reply.status_code == 200, reply.get_json()
    stored = store.get(reply.headers["X-Job-Id"]).request
    assert stored["messages"][1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert stored["messages"][2] == {"role": "tool", "content": "sunny", "name": "get_weather"}
    assert stored["tools"][0]["function"]["name"] == "get_weather" and "constraint" in stored  # the lazy call grammar


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_comes_back_with_arguments_as_an_object(client, store, celery, stream):
    worker_says(store, celery, ['{"name": "get_weather", ', '"arguments": {"city": "Paris"}}'])
    reply = chat(client, tools=[WEATHER_TOOL], stream=stream)
    parts = [ChatResponse(**line) for line in ndjson(reply)] if stream else [ChatResponse(**reply.get_json())]
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert all(not p.message.content for p in parts)  # the call's JSON is never shown as text
    assert parts[-1].done and parts[-1].done_reason == "stop"


@pytest.mark.parametrize("fmt, kind", [("json", "json"), ({"type": "object", "properties": {"a": {"type": "integer"}},
                                                             "required": ["a"]}, "json_schema")])
def test_format_is_held_by_the_grammar_as_response_format_is(client, store, celery, fmt, kind):
    worker_says(store, celery, ['{"a": 1}'])
    reply = chat(client, format=fmt, stream=False)
    assert reply.status_code == 200, reply.get_json()
    constraint = store.get(reply.headers["X-Job-Id"]).request["constraint"]
    assert constraint["kind"] in (kind, "json_object", "json") and constraint["grammar"]


@pytest.mark.parametrize("body, field", [
    ({"options": {"mirostat": 1}}, "options.mirostat"),
    ({"options": {"num_gpu": 1}}, "options.num_gpu"),
    ({"options": {"temperature": 5.0}}, "options.temperature"),
    ({"options": {"num_predict": 10**9}}, "options.num_predict"),
    ({"options": {"top_p": 0}}, "options.top_p"),
    ({"think": True}, "think"),
    ({"logprobs": True}, "logprobs"),
    ({"unknown_field": 1}, "unknown_field"),
    ({"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, "messages.0.images"),
    ({"format": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, "format"),
    ({"format": "json", "tools": [WEATHER_TOOL]}, "format"),
])
def test_refused_and_out_of_range_fields_are_a_400_naming_them(client, celery, body, field):
    reply = chat(client, **body)
    assert reply.status_code == 400, reply.get_json()
    assert list(reply.get_json()) == ["error"] and reply.get_json()["error"].startswith(f"{field}:")
    assert celery.sent == []


def test_num_predict_minus_one_is_the_servers_cap(make_app, store, celery):
    worker_says(store, celery, ["x"])
    reply = chat(make_app(max_new_tokens_cap=77).test_client(), options={"num_predict": -1}, stream=False)
    assert store.get(reply.headers["X-Job-Id"]).request["sampling"]["max_new_tokens"] == 77


def test_an_unknown_model_on_a_two_model_cluster_is_a_404_in_ollamas_shape(client, redis_client, celery):
    write_heartbeat(redis_client, "b@h:1", {"model_id": "other-model", "queue": "q"})
    reply = chat(client, model="llama3.2")
    assert reply.status_code == 404
    assert reply.get_json() == {"error": f"model: The model 'llama3.2' does not exist; this cluster serves "
                                         f"'other-model', '{DEFAULT_MODEL_NAME}'"} or "llama3.2" in reply.get_json()["error"]


def test_an_empty_chat_or_prompt_loads_nothing_and_says_ready(client, celery):
    for path, body in (("/api/chat", {"messages": []}), ("/api/generate", {})):
        reply = client.post(path, json={"model": "anything", **body})
        assert reply.status_code == 200 and reply.get_json()["done_reason"] == "load"
    assert celery.sent == []


def test_generate_is_a_chat_job_with_system_and_prompt(client, store, celery):
    worker_says(store, celery, ["4"])
    reply = client.post("/api/generate", json={"model": "default", "prompt": "2+2?", "system": "Be brief.",
                                               "stream": False, "options": {"num_predict": 3}})
    body = GenerateResponse(**reply.get_json())
    assert body.response == "4" and body.done and body.done_reason == "stop"
    job = store.get(reply.headers["X-Job-Id"])
    assert job.type == "chat" and job.request["messages"] == [{"role": "system", "content": "Be brief."},
                                                              {"role": "user", "content": "2+2?"}]


def test_generate_streams_response_pieces(client, store, celery):
    worker_says(store, celery, ["a", "b"])
    parts = [GenerateResponse(**line) for line in ndjson(client.post("/api/generate", json={"model": "m",
                                                                                          "prompt": "x"}))]
    assert [p.response for p in parts] == ["a", "b", ""] and parts[-1].done


@pytest.mark.parametrize("body, field", [
    ({"template": "{{ .Prompt }}"}, "template"), ({"context": [1, 2]}, "context"), ({"images": ["aGk="]}, "images"),
    ({"raw": True, "system": "s"}, "system"), ({"raw": True, "format": "json"}, "format"),
    ({"suffix": "tail"}, "suffix"),  # the bundled default's tokenizer is not here: no FIM tokens known
])
def test_generate_refusals_name_the_field(client, celery, body, field):
    reply = client.post("/api/generate", json={"model": "m", "prompt": "x", **body})
    assert reply.status_code == 400 and reply.get_json()["error"].startswith(f"{field}:"), reply.get_json()
    assert celery.sent == []


@pytest.fixture(scope="module")
def fim_folder(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-fim"), hidden_size=32, num_layers=1, fim_tokens=True)


def test_generate_raw_and_suffix_run_the_prompt_as_is(make_app, store, celery, fim_folder):
    client = make_app(model=str(fim_folder)).test_client()
    worker_says(store, celery, [" a + b"])
    reply = client.post("/api/generate", json={"model": "m", "prompt": "def add(a, b):\n    return",
                                               "suffix": "\n", "stream": False})
    assert reply.status_code == 200, reply.get_json()
    assert reply.get_json()["response"] == " a + b"
    job = store.get(reply.headers["X-Job-Id"])
    assert job.type == "completion"
    assert job.request["prompts"] == ["<|fim_prefix|>def add(a, b):\n    return<|fim_suffix|>\n<|fim_middle|>"]
    raw = client.post("/api/generate", json={"model": "m", "prompt": "<|im_start|>x", "raw": True, "stream": False})
    assert store.get(raw.headers["X-Job-Id"]).request["prompts"] == ["<|im_start|>x"]


def test_tags_show_ps_and_version_in_the_clients_types(client, redis_client):
    write_heartbeat(redis_client, "a@h:1", {"model_id": DEFAULT_MODEL_NAME, "queue": "q",
                                            "model_aliases": ["default", "qwen2.5-coder:0.5b"],
                                            "architecture": "qwen2 rope=default untied gqa=14:2", "quant": "q8"})
    write_heartbeat(redis_client, "b@h:1", {"model_id": "tiny-chat", "queue": "q2"})
    listed = ListResponse(**client.get("/api/tags").get_json())
    assert sorted(m.model for m in listed.models) == ["qwen2.5-coder:0.5b", "tiny-chat:latest"]
    running = ProcessResponse(**client.get("/api/ps").get_json())
    assert {m.model for m in running.models} == {"qwen2.5-coder:0.5b", "tiny-chat:latest"}
    assert next(m for m in client.get("/api/ps").get_json()["models"] if m["model"] == "tiny-chat:latest")["workers"] == ["b@h:1"]
    shown = ShowResponse(**client.post("/api/show", json={"model": "qwen2.5-coder:0.5b"}).get_json())
    assert shown.details.family == "qwen2" and shown.details.quantization_level == "q8"
    assert "completion" in shown.capabilities and shown.modelinfo["general.architecture"] == "qwen2"
    assert client.post("/api/show", json={"model": "tiny-chat:latest"}).status_code == 200
    missing = client.post("/api/show", json={"model": "nope:1b"})
    assert missing.status_code == 404 and "nope:1b" in missing.get_json()["error"]
    assert client.get("/api/version").get_json()["version"]


def test_num_ctx_is_checked_against_the_prompt_and_num_predict(make_app, store, celery, fim_folder):
    client = make_app(model=str(fim_folder)).test_client()
    worker_says(store, celery, ["x"])
    fits = chat(client, stream=False, options={"num_ctx": 4096, "num_predict": 8})
    assert fits.status_code == 200, fits.get_json()
    tight = chat(client, options={"num_ctx": 40, "num_predict": 30})
    assert tight.status_code == 400 and tight.get_json()["error"].startswith("options.num_ctx: "), tight.get_json()
    raw = client.post("/api/generate", json={"model": "m", "prompt": "x " * 50, "raw": True,
                                             "options": {"num_ctx": 20, "num_predict": 1}})
    assert raw.status_code == 400 and raw.get_json()["error"].startswith("options.num_ctx: ")
    assert len(celery.sent) == 1


def test_the_models_context_check_names_the_ollama_fields(make_app, celery, fim_folder):
    client = make_app(model=str(fim_folder), max_new_tokens_cap=100_000).test_client()
    over = chat(client, options={"num_predict": 4090})
    assert over.status_code == 400 and over.get_json()["error"].startswith("options.num_predict: "), over.get_json()
    long = client.post("/api/generate", json={"model": "m", "prompt": "word " * 5000})
    assert long.status_code == 400 and long.get_json()["error"].startswith("prompt: "), long.get_json()
    assert client.post("/api/show", json={"model": "m", "verbose": True}).get_json()["error"].startswith("verbose:")
    assert celery.sent == []


def test_ps_names_workers_by_stand_ins_for_keys_that_are_not_admin(make_app, redis_client):
    write_heartbeat(redis_client, "celery@secret-host", {"model_id": "tiny-chat", "queue": "q2"})
    client = make_app(api_keys=["user-key"], admin_api_keys=["admin-key"]).test_client()
    seen = client.get("/api/ps", headers={"Authorization": "Bearer user-key"}).get_json()["models"]
    assert "secret-host" not in str(seen) and seen[0]["workers"][0].startswith("worker-")
    admin = client.get("/api/ps", headers={"Authorization": "Bearer admin-key"}).get_json()["models"]
    assert admin[0]["workers"] == ["celery@secret-host"]
