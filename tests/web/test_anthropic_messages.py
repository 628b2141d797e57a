"""``/v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic's Messages API) on fakeredis with
a fake worker: the stored chat job (the same the chat route makes), the Message and its stream
of events (validated with the ``anthropic`` client's own types and put together by its own
stream accumulator), tool turns, ``tool_choice`` held by the chat path's grammar, fields
refused with a 400 naming them, errors in Anthropic's shape, ``x-api-key``, and
``count_tokens`` against the prompt the worker builds."""
from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from anthropic.types.message_count_tokens_params import MessageCountTokensParams
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from pydantic import TypeAdapter

from core.events import FAILED
from tests.tiny_model import make_tiny_model_dir
from tests.web.conftest import parse_sse, run_job
from web.anthropic.fields import COUNT_FIELDS, MESSAGE_FIELDS
from web.anthropic.schemas import BLOCK_TYPES

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}
WEATHER = {"name": "get_weather", "description": "Weather in a city", "input_schema": CITY}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
EVENTS = TypeAdapter(RawMessageStreamEvent)
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def says(store, celery, text: str, finish: str = "stop", stop_sequence: str | None = None, cached: int = 0,
         state: str | None = None):
    """The fake worker answers every job with ``text``, a word per token event."""
    words = text.split(" ")
    chunks = [w + " " for w in words[:-1]] + [words[-1]]
    payload = {"text": text, "finish_reason": finish, "method": "paged", "timings": {},
               "stop_sequence": stop_sequence,
               "usage": {"prompt_tokens": 30, "completion_tokens": len(chunks), "cached_tokens": cached}}
    if state is not None:
        payload = {"message": "engine broke", "code": "engine_error"}
    celery.runner = lambda job_id: run_job(store, job_id, chunks=chunks, payload=payload,
                                           **({"state": state} if state else {}))


def create(client, headers=None, **body):
    return client.post("/v1/messages", json={"model": "", "max_tokens": 64, "messages": ASK, **body},
                       headers=headers)


def message_of(response) -> Message:
    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    assert body["id"] == "msg_" + response.headers["X-Job-Id"]
    return Message.model_validate(body)


def events_of(response) -> list[dict]:
    """The stream's events (each validated by the client's types; ``event:`` is the type)."""
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    frames = parse_sse(response.get_data(as_text=True))
    assert all(f["event"] == f["data"]["type"] for f in frames)
    for frame in frames:
        if frame["event"] not in ("error", "ping"):  # not message events (the client handles them apart)
            EVENTS.validate_python(frame["data"])
    return [f["data"] for f in frames]


def accumulated(events: list[dict]):
    """The message the ``anthropic`` client's stream accumulator builds from these events."""
    snapshot, buffers = None, {}
    for event in events:
        if event["type"] != "ping":
            snapshot = accumulate_event(event=EVENTS.validate_python(event), current_snapshot=snapshot,
                                        json_bufs=buffers)
    return snapshot


def error_of(response, status: int) -> str:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]["message"]


# ---- the job --------------------------------------------------------------------------------
def test_a_message_is_the_chat_job_and_answers_a_message(client, store, celery):
    says(store, celery, "It is sunny.", cached=12)
    response = create(client, system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": " Really."}],
                      max_tokens=20, temperature=0.5, top_p=0.9, top_k=3, stop_sequences=["\n\n"],
                      metadata={"user_id": "u-1"}, seed=4, generation_method="custom_cache", stop="###",
                      presence_penalty=0.5)
    answer = message_of(response)
    job = store.get(response.headers["X-Job-Id"])
    assert answer.content[0].type == "text" and answer.content[0].text == "It is sunny." and len(answer.content) == 1
    assert (answer.role, answer.stop_reason, answer.stop_sequence) == ("assistant", "end_turn", None)
    assert answer.model == job.request["model"]
    assert (answer.usage.input_tokens, answer.usage.cache_read_input_tokens, answer.usage.output_tokens,
            answer.usage.cache_creation_input_tokens) == (18, 12, 3, 0)   # 30 prompt tokens, 12 of them cached
    assert job.type == "chat" and job.request["method"] == "custom_cache"
    assert job.request["messages"] == [{"role": "system", "content": "Be brief. Really."},
                                       {"role": "user", "content": "What is the weather in Paris?"}]
    assert job.request["sampling"] | {"max_new_tokens": 20, "temperature": 0.5, "top_p": 0.9, "top_k": 3,
                                      "seed": 4, "stop": ["\n\n", "###"], "presence_penalty": 0.5
                                      } == job.request["sampling"]


def test_omitted_temperature_is_greedy_as_everywhere_here(client, store, celery):
    says(store, celery, "ok")
    job = store.get(create(client).headers["X-Job-Id"])
    assert job.request["sampling"]["temperature"] == 0.0 and job.request["tools"] is None


@pytest.mark.parametrize("finish,stop_sequence,expected", [
    ("stop", None, ("end_turn", None)), ("length", None, ("max_tokens", None)),
    ("stop", "END", ("stop_sequence", "END"))])
def test_stop_reason(client, store, celery, finish, stop_sequence, expected):
    says(store, celery, "one two", finish=finish, stop_sequence=stop_sequence)
    answer = message_of(create(client, stop_sequences=["END"]))
    assert (answer.stop_reason, answer.stop_sequence) == expected


def test_tool_turns_become_chat_tool_calls_and_tool_messages(client, store, celery):
    says(store, celery, "It is 21 C in Paris.")
    turns = ASK + [
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"},
                                     {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                                      "content": [{"type": "text", "text": "no data"}]},
                                     {"type": "text", "text": "And Rome?", "cache_control": {"type": "ephemeral"}}]}]
    response = create(client, messages=turns, tools=[WEATHER])
    message_of(response)
    job = store.get(response.headers["X-Job-Id"])
    assert job.request["messages"] == [
        ASK[0],
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "21 C", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "Error: no data", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "And Rome?"}]
    assert job.request["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city", "parameters": CITY}}]


@pytest.mark.parametrize("choice,hint,lazy", [
    ({"type": "auto"}, None, True), ({"type": "any"}, "Answer with a call to one of the functions", False),
    ({"type": "tool", "name": "get_weather"}, "Answer with a call to the function `get_weather`", False)])
def test_tool_choice_is_the_chat_paths_grammar(client, store, celery, choice, hint, lazy):
    says(store, celery, CALL)
    response = create(client, tools=[WEATHER], tool_choice=choice)
    message_of(response)
    request = store.get(response.headers["X-Job-Id"]).request
    chat = client.post("/v1/chat/completions", json={
        "messages": ASK, "max_tokens": 64, "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather in a city", "parameters": CITY}}],
        "tool_choice": {"auto": "auto", "any": "required"}.get(choice["type"], {
            "type": "function", "function": {"name": "get_weather"}})})
    assert request["constraint"] == store.get(chat.headers["X-Job-Id"]).request["constraint"]
    assert bool(request["constraint"]["lazy"]) == lazy
    last = request["messages"][-1]
    assert (last["content"].startswith(hint) and last["role"] == "system") if hint else last == ASK[0]


def test_tool_choice_none_hides_the_tools_and_disable_parallel_is_one_call(client, store, celery):
    says(store, celery, CALL + "\n" + CALL)
    none = store.get(create(client, tools=[WEATHER], tool_choice={"type": "none"}).headers["X-Job-Id"])
    assert none.request["tools"] is None and "constraint" not in none.request
    answer = message_of(create(client, tools=[WEATHER], tool_choice={"type": "any",
                                                                       "disable_parallel_tool_use": True}))
    assert [block.type for block in answer.content] == ["tool_use"]


def test_a_call_comes_back_as_a_tool_use_block(client, store, celery):
    says(store, celery, CALL + "\n" + CALL.replace("Paris", "Rome"))
    response = create(client, tools=[WEATHER], tool_choice={"type": "any"})
    answer = message_of(response)
    job_id = response.headers["X-Job-Id"]
    assert answer.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input, b.id) for b in answer.content] == [
        ("tool_use", "get_weather", {"city": "Paris"}, f"toolu_{job_id[:20]}_0"),
        ("tool_use", "get_weather", {"city": "Rome"}, f"toolu_{job_id[:20]}_1")]


def test_a_json_answer_under_auto_stays_text(client, store, celery):
    says(store, celery, '{"city": "Paris", "temperature": 21}')
    answer = message_of(create(client, tools=[WEATHER]))
    assert [b.type for b in answer.content] == ["text"] and answer.stop_reason == "end_turn"


# ---- the stream -------------------------------------------------------------------------------
def test_text_streams_in_anthropics_event_order(client, store, celery):
    says(store, celery, "It is sunny.", cached=4)
    events = events_of(create(client, stream=True))
    types = [e["type"] for e in events]
    deltas = len(types) - 6
    assert types == ["message_start", "ping", "content_block_start"] + ["content_block_delta"] * deltas + [
        "content_block_stop", "message_delta", "message_stop"] and deltas == 3
    assert events[0]["message"]["content"] == [] and events[0]["message"]["stop_reason"] is None
    assert all(e["index"] == 0 and e["delta"]["type"] == "text_delta" for e in events if e["type"] ==
               "content_block_delta")
    final = accumulated(events)
    assert [b.text for b in final.content] == ["It is sunny."] and final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens, final.usage.output_tokens) == (26, 4, 3)


def test_the_streamed_message_is_the_plain_one(client, store, celery):
    """The client's accumulator builds, from the stream, the message the plain request answers
    (ids differ only by the job)."""
    for body in ({}, {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}},
                 {"tools": [WEATHER]}):
        text = CALL if body else "It is sunny."
        says(store, celery, text)
        plain = create(client, **body).get_json()
        streamed = create(client, stream=True, **body)
        final = accumulated(events_of(streamed)).model_dump(exclude_none=True)
        job_id, plain_job = streamed.headers["X-Job-Id"], plain["id"][len("msg_"):]
        assert json.loads(json.dumps(final).replace(job_id, plain_job).replace(job_id[:20], plain_job[:20])) == \
            Message.model_validate(plain).model_dump(exclude_none=True)


def test_a_forced_call_streams_its_input_as_json_deltas(client, store, celery):
    says(store, celery, CALL)
    events = events_of(create(client, stream=True, tools=[WEATHER], tool_choice={"type": "any"}))
    start = next(e for e in events if e["type"] == "content_block_start")
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
    assert start["content_block"]["name"] == "get_weather"
    pieces = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"city": "Paris"}
    assert not any(e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta" for e in events)
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_held_text_and_a_late_call_are_sent_at_the_end_as_blocks(client, store, celery):
    says(store, celery, "Let me check.\n<tool_call>\n" + CALL + "\n</tool_call>")
    events = events_of(create(client, stream=True, tools=[WEATHER]))
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "text"), (1, "tool_use")]
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert stops == [0, 1]
    final = accumulated(events)
    assert final.content[0].text == "Let me check." and final.content[1].input == {"city": "Paris"}


def test_a_failed_job_ends_the_stream_with_an_error_event(client, store, celery):
    says(store, celery, "x", state=FAILED)
    events = events_of(create(client, stream=True))
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "engine broke"}}
    assert "engine broke" in error_of(create(client), 500)


# ---- refused fields and errors ---------------------------------------------------------------
def test_every_field_of_the_clients_request_is_in_the_table():
    """The table covers every field the ``anthropic`` client can send (the create and the
    count_tokens params), so none is silently dropped; the count table is a subset."""
    sent = set(typing.get_type_hints(MessageCreateParamsNonStreaming)) - {"temperature", "top_p", "top_k"}
    assert sent <= set(MESSAGE_FIELDS), sent - set(MESSAGE_FIELDS)
    assert set(typing.get_type_hints(MessageCountTokensParams)) == set(COUNT_FIELDS)


@pytest.mark.parametrize("name", [n for n, rule in MESSAGE_FIELDS.items() if rule.kind == "refused"])
def test_a_refused_field_is_a_400_naming_it(client, celery, name):
    message = error_of(create(client, **{name: {"type": "enabled"}}), 400)
    assert message.startswith(f"{name}: not supported") and not celery.sent


@pytest.mark.parametrize("body,field", [
    ({"nonsense": 1}, "nonsense"),
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"temperature": 2.5}, "temperature"),
    ({"stop_sequences": [""]}, "stop_sequences.0"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content.0"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "citations": []}]}]},
     "messages.0.content.0.citations"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]},
     "messages.0.content.0.extra"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "messages.0"),
    ({"messages": ASK + [{"role": "assistant", "content": "It is"}]}, "messages"),
    ({"system": [{"type": "document", "source": {}}]}, "system.0.type"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ({"tools": [{**WEATHER, "defer_loading": True}]}, "tools.0.defer_loading"),
    ({"tools": [{**WEATHER, "input_schema": {"type": "nonsense"}}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "required"}}, "tool_choice"),
    ({"metadata": {"user_id": "u", "other": 1}}, "metadata.other"),
])
def test_bad_input_is_a_400_naming_the_field(client, celery, body, field):
    message = error_of(create(client, **body), 400)
    assert message.startswith(f"{field}:") or message.startswith(f"{field} "), message
    assert not celery.sent


def test_a_claude_name_on_a_one_model_cluster_is_that_model(make_app, store, celery, tiny_folder):
    """Model names resolve as on every surface (``core.models``): with one model served, any
    name answers with it, and the answer names the model that answered."""
    client = make_app(model=str(tiny_folder)).test_client()
    says(store, celery, "ok")
    answer = message_of(create(client, model="claude-sonnet-4-5"))
    assert answer.model == tiny_folder.name
    counts = [client.post("/v1/messages/count_tokens", json={"model": name, "messages": ASK}).get_json()
              for name in ("claude-sonnet-4-5", tiny_folder.name)]
    assert counts[0] == counts[1] and counts[0]["input_tokens"] > 5


def test_wrong_paths_and_methods_answer_in_anthropics_shape(client):
    error_of(client.get("/v1/messages"), 405)
    assert client.post("/v1/messages/nothing", json={}).get_json()["error"]["type"] == "not_found_error"
    error_of(client.post("/v1/messages", data="{", content_type="application/json"), 400)


def test_other_v1_routes_keep_openais_shape(client):
    body = client.post("/v1/chat/completions", json={"messages": ASK, "thinking": 1}).get_json()
    assert "type" not in body and body["error"]["param"] == "thinking"


def test_x_api_key_is_a_key_as_a_bearer_header_is(make_app, store, celery):
    client = make_app(api_keys=["k-1"]).test_client()
    says(store, celery, "ok")
    assert error_of(create(client), 401) and error_of(create(client, headers={"x-api-key": "wrong"}), 401)
    keyed = create(client, headers={"x-api-key": "k-1", "anthropic-version": "2023-06-01"})
    bearer = create(client, headers={"Authorization": "Bearer k-1"})
    assert keyed.status_code == bearer.status_code == 200
    owners = {store.get(r.headers["X-Job-Id"]).owner for r in (keyed, bearer)}
    assert len(owners) == 1 and None not in owners
    assert client.get("/jobs", headers={"x-api-key": "k-1"}).status_code == 200
    assert error_of(create(client, headers={"x-api-key": "k-1", "Authorization": "Basic eA=="}), 401)  # it decides


# ---- count_tokens and the document --------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-anthropic"), hidden_size=32, num_layers=1)


@pytest.mark.parametrize("extra", [{}, {"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": {"type": "any"}}])
def test_count_tokens_is_the_workers_prompt(make_app, store, celery, tiny_folder, extra):
    """The count is the length of the prompt the worker builds from the job ``/v1/messages``
    stores for the same body (system, tool turns, tools and the forced call's line included)."""
    from transformers import AutoTokenizer

    from engine.prompt import build_prompt
    from worker.requests import generation_request_from

    client = make_app(model=str(tiny_folder)).test_client()
    turns = ASK + [{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                      "input": {"city": "Paris"}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "21 C"}]}]
    body = {"model": tiny_folder.name, "system": "Be brief.", "messages": turns, **extra}
    response = client.post("/v1/messages/count_tokens", json=body)
    assert response.status_code == 200, response.get_json()
    count = MessageTokensCount.model_validate(response.get_json()).input_tokens
    says(store, celery, CALL)
    made = client.post("/v1/messages", json={**body, "max_tokens": 8})
    job = store.get(made.headers["X-Job-Id"])
    worker = build_prompt(AutoTokenizer.from_pretrained(str(tiny_folder)), generation_request_from(job.request, 8))
    assert count == len(worker.ids) and count > 20
    refused = client.post("/v1/messages/count_tokens", json={**body, "max_tokens": 8})
    assert error_of(refused, 400).startswith("max_tokens: unknown field")   # not a count_tokens field


def test_the_routes_are_in_the_openapi_document(client):
    paths = client.get("/openapi.json").get_json()["paths"]
    assert {"/v1/messages", "/v1/messages/count_tokens"} <= set(paths)
    create_op = paths["/v1/messages"]["post"]
    assert "text/event-stream" in create_op["responses"]["200"]["content"]
    assert create_op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("MessagesRequest")


def test_block_types_are_the_ones_documented():
    assert BLOCK_TYPES == ("text", "tool_use", "tool_result")


def test_docs_api_table_is_the_code_table():
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    section = text[text.index("### `POST /v1/messages`: every request field"):]
    section = section[:section.index("\n### ", 1)]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (honoured|no_effect|refused) \|", section, re.MULTILINE))
    assert rows == {name: rule.kind for name, rule in MESSAGE_FIELDS.items()}
