"""``/v1/responses`` on fakeredis with a fake worker: the stored chat job, the Response object and
its stream of events (validated with the ``openai`` client's own types), input items, tools,
``previous_response_id`` over the stored job, ``store: false``, and errors naming the field."""
from __future__ import annotations

import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from core.events import FAILED
from tests.web.conftest import parse_sse, run_job

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
EVENTS = TypeAdapter(ResponseStreamEvent)


def says(store, celery, text: str, finish: str = "stop", state: str | None = None):
    """The fake worker answers every job with ``text``, a word per token event."""
    words = text.split(" ")
    chunks = [w + " " for w in words[:-1]] + [words[-1]]
    payload = {"text": text, "finish_reason": finish, "method": "paged", "timings": {},
               "usage": {"prompt_tokens": 9, "completion_tokens": len(chunks), "cached_tokens": 0}}
    kwargs = {"state": state, "payload": {"message": "engine broke", "code": "engine_error"}} if state else {}
    celery.runner = lambda job_id: run_job(store, job_id, chunks=chunks, **(kwargs or {"payload": payload}))


def create(client, **body):
    return client.post("/v1/responses", json={"input": "What is the weather in Paris?", **body})


def events_of(response) -> list[dict]:
    frames = parse_sse(response.get_data(as_text=True))
    assert all(f["event"] == f["data"]["type"] for f in frames)
    for frame in frames:
        EVENTS.validate_python(frame["data"])
    return [f["data"] for f in frames]


def test_a_string_input_runs_a_chat_job_and_answers_a_response(client, store, celery):
    says(store, celery, "It is sunny.")
    response = create(client, instructions="Be brief.", max_output_tokens=20, temperature=0.5, top_p=0.9,
                      seed=4, top_k=3, generation_method="custom_cache")
    assert response.status_code == 200, response.get_json()
    body = Response.model_validate(response.get_json())
    job = store.get(response.headers["X-Job-Id"])
    assert body.id == f"resp_{job.id}" and body.status == "completed" and body.output_text == "It is sunny."
    assert (body.usage.input_tokens, body.usage.output_tokens, body.usage.total_tokens) == (9, 3, 12)
    assert body.instructions == "Be brief." and body.max_output_tokens == 20 and body.temperature == 0.5
    assert job.type == "chat" and job.request["method"] == "custom_cache"
    assert job.request["messages"] == [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "What is the weather in Paris?"}]
    assert job.request["sampling"] | {"max_new_tokens": 20, "temperature": 0.5, "top_p": 0.9, "top_k": 3,
                                      "seed": 4} == job.request["sampling"]


def test_input_items_become_chat_messages_with_tool_turns(client, store, celery):
    says(store, celery, "It is 21 C in Paris.")
    items = [{"role": "developer", "content": "Use tools."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}',
              "id": "fc_1", "status": "completed"},
             {"type": "function_call_output", "call_id": "c1", "output": "21 C"}]
    response = client.post("/v1/responses", json={"input": items, "tools": [WEATHER]})
    assert response.status_code == 200, response.get_json()
    job = store.get(response.headers["X-Job-Id"])
    assert job.request["messages"] == [
        {"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "21 C", "tool_call_id": "c1"}]
    assert job.request["tools"][0]["function"]["name"] == "get_weather"


def test_a_call_comes_back_as_a_function_call_item(client, store, celery):
    says(store, celery, CALL)
    body = Response.model_validate(create(client, tools=[WEATHER]).get_json())
    [item] = body.output
    assert item.type == "function_call" and item.name == "get_weather" and json.loads(item.arguments) == {
        "city": "Paris"} and item.call_id.startswith("call_")


def test_a_json_answer_under_auto_stays_a_message(client, store, celery):
    says(store, celery, '{"city": "Paris", "temperature": 21}')
    body = Response.model_validate(create(client, tools=[WEATHER]).get_json())
    assert [item.type for item in body.output] == ["message"]


def test_a_cut_answer_is_incomplete(client, store, celery):
    says(store, celery, "It is", finish="length")
    body = Response.model_validate(create(client, max_output_tokens=2).get_json())
    assert body.status == "incomplete" and body.incomplete_details.reason == "max_output_tokens"
    assert body.output[0].status == "incomplete"


def test_text_streams_as_response_events_in_order(client, store, celery):
    says(store, celery, "It is sunny.")
    events = events_of(create(client, stream=True))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-5:] == ["response.output_text.delta", "response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "It is sunny."
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == "It is sunny." and final.status == "completed"


def test_a_call_streams_its_arguments(client, store, celery):
    says(store, celery, CALL)
    events = events_of(create(client, stream=True, tools=[WEATHER]))
    types = [e["type"] for e in events]
    assert "response.output_text.delta" not in types and types[-1] == "response.completed"
    added = next(e for e in events if e["type"] == "response.output_item.added")["item"]
    assert added["type"] == "function_call" and added["arguments"] == "" and added["name"] == "get_weather"
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and json.loads("".join(deltas)) == {"city": "Paris"}
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert json.loads(done["arguments"]) == {"city": "Paris"}
    assert Response.model_validate(events[-1]["response"]).output[0].type == "function_call"


def test_held_text_and_a_late_call_are_sent_at_the_end(client, store, celery):
    says(store, celery, "Let me check.\n<tool_call>\n" + CALL + "\n</tool_call>")
    events = events_of(create(client, stream=True, tools=[WEATHER]))
    items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in items] == ["message", "function_call"]
    assert items[0]["content"][0]["text"] == "Let me check."


def test_a_failed_job_ends_the_stream_with_response_failed(client, store, celery):
    says(store, celery, "x", state=FAILED)
    events = events_of(create(client, stream=True))
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed" and "engine broke" in events[-1]["response"]["error"]["message"]
    response = create(client)
    assert response.status_code >= 500 and response.get_json()["error"]["code"]


def test_previous_response_id_continues_the_stored_conversation(client, store, celery):
    says(store, celery, CALL)
    first = create(client, tools=[WEATHER], instructions="Be brief.").get_json()
    call = first["output"][0]
    says(store, celery, "It is 21 C.")
    second = client.post("/v1/responses", json={
        "previous_response_id": first["id"], "tools": [WEATHER],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "21 C"}]})
    assert second.status_code == 200, second.get_json()
    assert second.get_json()["previous_response_id"] == first["id"]
    messages = store.get(second.headers["X-Job-Id"]).request["messages"]
    assert messages == [  # the first instructions are not carried over, as OpenAI
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call["call_id"], "type": "function",
                                                             "function": {"name": "get_weather",
                                                                          "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "21 C", "tool_call_id": call["call_id"]}]
    retrieved = client.get(f"/v1/responses/{first['id']}")
    assert retrieved.status_code == 200 and retrieved.get_json()["output"] == first["output"]


def test_store_false_is_neither_retrievable_nor_continuable(client, store, celery):
    says(store, celery, "ok")
    first = create(client, store=False).get_json()
    assert first["store"] is False
    assert client.get(f"/v1/responses/{first['id']}").status_code == 404
    response = create(client, previous_response_id=first["id"])
    error = response.get_json()["error"]
    assert response.status_code == 404 and error["param"] == "previous_response_id"


@pytest.mark.parametrize("previous", ["resp_0123456789abcdef0123456789abcdef", "chatcmpl-1", "resp_../x"])
def test_an_unknown_previous_response_is_a_404_naming_the_field(client, previous):
    response = create(client, previous_response_id=previous)
    assert response.status_code == 404 and response.get_json()["error"]["param"] == "previous_response_id"


def test_a_chat_job_is_not_a_stored_response(client, store, celery):
    says(store, celery, "ok")
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert client.get(f"/v1/responses/resp_{chat.headers['X-Job-Id']}").status_code == 404


@pytest.mark.parametrize("body,param", [
    ({"max_output_tokens": 10**6}, "max_output_tokens"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"tools": [{**WEATHER, "parameters": {"type": "nonsense"}}]}, "tools.0.parameters"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "$ref": "#/no"}}}},
     "text.format.schema"),
    ({"text": {"verbosity": "high"}}, "text.verbosity"),
    ({"input": [{"type": "input_image", "image_url": "http://x"}]}, "input.0"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"background": True, "store": False}, "background"),
    ({"min_p": 1.5}, "min_p"),
])
def test_bad_input_is_a_400_naming_the_field(client, body, param):
    response = create(client, **body)
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def test_a_background_response_answers_at_once_and_can_be_cancelled(client, store, celery):
    celery.runner = None  # no worker takes it: it stays queued
    first = create(client, background=True)
    assert first.status_code == 200, first.get_json()
    body = Response.model_validate(first.get_json())
    assert body.status == "queued" and body.background is True and body.output == []
    assert client.get(f"/v1/responses/{body.id}").get_json()["status"] == "queued"
    cancelled = client.post(f"/v1/responses/{body.id}/cancel")
    assert cancelled.status_code == 200 and cancelled.get_json()["status"] == "cancelled"
    assert store.get(first.headers["X-Job-Id"]).state == "cancelled"
    assert client.get(f"/v1/responses/{body.id}").get_json()["status"] == "cancelled"


def test_only_a_background_response_can_be_cancelled(client, store, celery):
    says(store, celery, "ok")
    done = create(client).get_json()
    response = client.post(f"/v1/responses/{done['id']}/cancel")
    assert response.status_code == 400 and response.get_json()["error"]["param"] == "response_id"
