"""``/v1/chat/completions`` and ``/v1/models`` on fakeredis with a fake worker: the stored job,
the OpenAI response and chunk shapes, tool calls, errors, and cancel-on-disconnect."""
from __future__ import annotations

import json
import time

import pytest
import redis

from core import tasks
from core.events import CANCELLED, FAILED
from tests.web.conftest import run_job

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def chat(client, **body):
    return client.post("/v1/chat/completions", json={"messages": USER, **body})


def worker_says(store, celery, text: str, **kw):
    """The fake worker answers every job with ``text`` (as one token chunk per word)."""
    chunks = [w + " " for w in text.split(" ")[:-1]] + [text.split(" ")[-1]]
    celery.runner = lambda job_id: run_job(store, job_id, chunks=chunks, **kw)


def data_lines(body: bytes) -> list[str]:
    return [line[len("data: "):] for line in body.decode().split("\n") if line.startswith("data: ")]


def test_plain_completion_runs_a_chat_job_with_the_stored_request_shape(client, store, celery):
    worker_says(store, celery, "Hello there")
    response = chat(client, max_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop="\n\n", top_k=5,
                    generation_method="custom_cache", user="ignored-field")
    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    job_id = response.headers["X-Job-Id"]
    assert body["id"] == f"chatcmpl-{job_id}" and body["object"] == "chat.completion"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello there"},
                                "finish_reason": "length", "logprobs": None}]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert body["miniserve"]["job_id"] == job_id
    sent = celery.sent[0]
    assert (sent["name"], sent["queue"], sent["task_id"]) == (tasks.GENERATE, "generation", job_id)
    job = store.get(job_id)
    assert job.type == "chat"
    assert job.request == {"messages": USER, "prefix": None, "method": "custom_cache", "tools": None,
                           "max_steps": None, "model": "qwen2.5-coder-0.5b-instruct", "priority": "interactive",
                           "sampling": {"max_new_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 5,
                                        "repetition_penalty": None, "seed": 3, "stop": ["\n\n"]}}


def test_defaults_are_greedy_and_the_settings_method(make_app, store, celery):
    worker_says(store, celery, "ok")
    client = make_app(default_generation_method="prefix_cache", default_max_new_tokens=9).test_client()
    response = chat(client, max_tokens=3, max_completion_tokens=4)
    job = store.get(response.headers["X-Job-Id"])
    assert job.request["method"] == "prefix_cache"
    assert job.request["sampling"]["temperature"] == 0.0 and job.request["sampling"]["max_new_tokens"] == 4
    chat(client)
    assert store.get(celery.sent[-1]["task_id"]).request["sampling"]["max_new_tokens"] == 9


def test_messages_are_normalised_for_the_chat_template(client, store, celery):
    worker_says(store, celery, "ok")
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Paris?"}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    response = client.post("/v1/chat/completions", json={"messages": messages, "tools": [WEATHER_TOOL]})
    assert response.status_code == 200
    stored = store.get(response.headers["X-Job-Id"]).request
    assert stored["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    assert stored["tools"] == [WEATHER_TOOL]


def test_streamed_chunks_concatenate_to_the_text_and_end_with_usage_and_done(client, store, celery):
    worker_says(store, celery, "one two three")
    response = chat(client, stream=True, stream_options={"include_usage": True})
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    lines = data_lines(response.data)
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == f"chatcmpl-{response.headers['X-Job-Id']}"
               for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "one two three"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["usage"] is None for c in chunks[:-1])


def test_a_tool_call_in_the_text_is_returned_as_tool_calls(client, store, celery):
    worker_says(store, celery, '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```')
    body = chat(client, tools=[WEATHER_TOOL]).get_json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize("text", [
    '{"name": "delete_files", "arguments": {"path": "/"}}',  # undeclared function
    '{"name": "get_weather", "arguments": {"town": "Paris"}}',  # arguments fail the schema
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',  # one bad call spoils the set
])
def test_calls_that_are_undeclared_or_invalid_stay_plain_content(client, store, celery, text):
    worker_says(store, celery, text)
    choice = chat(client, tools=[WEATHER_TOOL]).get_json()["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == text


def test_tool_choice_none_hides_tools_and_returns_content(client, store, celery):
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    worker_says(store, celery, text)
    response = chat(client, tools=[WEATHER_TOOL], tool_choice="none")
    assert response.get_json()["choices"][0]["message"] == {"role": "assistant", "content": text}
    assert store.get(response.headers["X-Job-Id"]).request["tools"] is None


def test_named_tool_choice_asks_for_that_function_and_accepts_only_it(client, store, celery):
    other = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    worker_says(store, celery, '{"name": "get_time", "arguments": {}}')
    response = chat(client, tools=[WEATHER_TOOL, other],
                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert response.get_json()["choices"][0]["finish_reason"] == "length"  # get_time was not chosen
    stored = store.get(response.headers["X-Job-Id"]).request
    assert stored["messages"][-1] == {"role": "system", "content": "Answer with a call to the function `get_weather`."}
    worker_says(store, celery, '{"name": "get_time", "arguments": {}}')
    assert chat(client, tools=[WEATHER_TOOL, other], tool_choice="required").get_json()[
        "choices"][0]["finish_reason"] == "tool_calls"


def test_parallel_tool_calls_false_returns_one_call(client, store, celery):
    two = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
           '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>')
    worker_says(store, celery, two)
    assert len(chat(client, tools=[WEATHER_TOOL]).get_json()["choices"][0]["message"]["tool_calls"]) == 2
    calls = chat(client, tools=[WEATHER_TOOL], parallel_tool_calls=False).get_json()["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"])["city"] for c in calls] == ["Paris"]


def test_streaming_with_tools_holds_the_text_back_and_sends_tool_call_deltas(client, store, celery):
    worker_says(store, celery, '{"name": "get_weather", "arguments": {"city": "Paris"}}')
    response = chat(client, tools=[WEATHER_TOOL], stream=True)
    assert ": keep-alive" in response.data.decode()  # one per held-back token
    chunks = [json.loads(line) for line in data_lines(response.data)[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert not any("content" in d and d["content"] for d in deltas)
    (call,) = deltas[1]["tool_calls"]
    assert call["index"] == 0 and call["function"]["name"] == "get_weather"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("body, param", [
    ({"temperature": 5}, "temperature"),
    ({"max_tokens": 10**9}, "max_tokens"),
    ({"n": 17}, "n"),
    ({"n": 0}, "n"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
     "tools.0.function.parameters"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_bad_requests_get_openai_errors_and_enqueue_nothing(client, celery, body, param):
    response = client.post("/v1/chat/completions", json={"messages": USER, **body})
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert celery.sent == []


def test_malformed_json_and_missing_key_are_openai_errors(make_app):
    client = make_app(api_keys=["k1"]).test_client()
    response = client.get("/v1/models")
    assert response.status_code == 401
    assert response.get_json()["error"]["type"] == "authentication_error"
    response = client.post("/v1/chat/completions", data="{nope", content_type="application/json",
                           headers={"Authorization": "Bearer k1"})
    assert response.status_code == 400 and response.get_json()["error"]["code"] == "malformed_json"
    assert client.get("/v1/models", headers={"Authorization": "Bearer k1"}).get_json()["data"][0]["object"] == "model"
    assert "code" in client.get("/jobs").get_json()["error"]  # MiniServe's own routes keep their shape


@pytest.mark.parametrize("state, status, code", [(FAILED, 500, "boom"), (CANCELLED, 409, "job_cancelled")])
def test_a_job_that_does_not_succeed_is_an_openai_error(client, store, celery, state, status, code):
    celery.runner = lambda job_id: run_job(store, job_id, state=state, payload={"code": "boom", "message": "broke"})
    response = chat(client)
    assert response.status_code == status
    assert response.get_json()["error"]["code"] == code and response.headers["X-Job-Id"]


def test_a_failed_job_mid_stream_ends_with_an_error_chunk(client, store, celery):
    celery.runner = lambda job_id: run_job(store, job_id, state=FAILED, payload={"code": "boom", "message": "broke"})
    lines = data_lines(chat(client, stream=True).data)
    assert json.loads(lines[-2])["error"] == {"message": "broke", "type": "server_error", "param": None, "code": "boom"}
    assert lines[-1] == "[DONE]"


def test_redis_lost_mid_stream_ends_the_stream_with_an_error_chunk(client, store, celery, monkeypatch):
    """The job store going away while a ``/v1`` stream follows a running job: the client gets
    an error chunk in OpenAI's shape, not a cut connection (the job itself is left to run)."""
    def start_and_stream(job_id: str) -> None:
        started = store.start_attempt(job_id, "fake-worker", lease_s=30)
        store.append_event(job_id, started.attempt, "token", {"text": "partial"})

    def redis_down(*_args, **_kwargs):
        raise redis.ConnectionError("Connection refused")

    celery.runner = start_and_stream
    monkeypatch.setattr(store, "wait_events", redis_down)
    response = chat(client, stream=True)
    lines, job_id = data_lines(response.data), response.headers["X-Job-Id"]
    assert json.loads(lines[1])["choices"][0]["delta"] == {"content": "partial"}
    error = json.loads(lines[-1])["error"]
    assert error["code"] == "store_unavailable" and error["type"] == "server_error" and job_id in error["message"]
    assert not store.cancel_requested(job_id)  # the client did not leave: the job goes on


def _open_stream(client, **body):
    response = client.post("/v1/chat/completions", json={"messages": USER, "stream": True, **body},
                           buffered=False)
    chunks = iter(response.response)
    first = next(chunks)
    return response, chunks, first


def test_a_client_leaving_mid_stream_cancels_its_running_job(client, store, celery):
    celery.threaded = True
    celery.runner = lambda job_id: run_job(store, job_id, chunks=["a"] * 200, delay_s=0.02)
    response, chunks, first = _open_stream(client)
    job_id = response.headers["X-Job-Id"]
    assert b"chat.completion.chunk" in first
    while b'"content": "a"' not in next(chunks):
        pass
    assert not store.cancel_requested(job_id)
    response.close()  # what the server does when a write to the socket fails
    assert store.cancel_requested(job_id)


def test_a_client_leaving_before_the_job_starts_cancels_and_revokes_it(client, store, celery):
    response, chunks, _ = _open_stream(client)  # no worker: the job stays queued
    job_id = response.headers["X-Job-Id"]
    response.close()
    assert store.get(job_id).state == CANCELLED
    assert celery.control.revoked == [job_id]


def test_a_finished_stream_cancels_nothing(client, store, celery):
    worker_says(store, celery, "done here")
    response, chunks, _ = _open_stream(client)
    rest = b"".join(chunks)
    response.close()
    assert rest.endswith(b"data: [DONE]\n\n")
    assert not store.cancel_requested(response.headers["X-Job-Id"])


def test_models_lists_the_served_model(make_app, tmp_path):
    assert make_app().test_client().get("/v1/models").get_json()["data"][0]["id"] == "qwen2.5-coder-0.5b-instruct"
    folder = tmp_path / "my-model"
    folder.mkdir()
    card = make_app(model=str(folder)).test_client().get("/v1/models").get_json()["data"][0]
    assert card["id"] == "my-model" and card["owned_by"] == "miniserve" and card["created"] <= time.time()


def test_the_openapi_document_describes_the_v1_routes(client):
    spec = client.get("/openapi.json").get_json()
    post = spec["paths"]["/v1/chat/completions"]["post"]
    assert "text/event-stream" in post["responses"]["200"]["content"]
    assert spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]["max_tokens"]["anyOf"][0]["maximum"] == 2048
    assert "/v1/models" in spec["paths"]
