"""The real ``anthropic`` client against the running service (redis-server, a Celery worker with
the tiny random model, gunicorn web): a plain message, a streamed one put together by the
client's ``messages.stream`` helper, a tool round trip (``tool_choice`` forcing a call, its
``tool_result``, the answer), ``count_tokens`` against the usage the worker reports, and
``x-api-key`` on a web that requires keys. Answers are checked against the client's own
types (strict validation of the raw JSON). Random weights write a valid call only because
of the grammar."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest
from anthropic.types import Message

from tests.integration.conftest import started_web

CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
        "required": ["city"], "additionalProperties": False}
WEATHER = {"name": "get_weather", "description": "Weather in a city", "input_schema": CITY}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
KEY = "anthropic-surface-key"


@pytest.fixture(scope="module")
def client(base_url):
    with anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def created(client, **body) -> Message:
    """``messages.create``, its raw JSON validated strictly against the client's type."""
    raw = client.messages.with_raw_response.create(**body)
    Message.model_validate(json.loads(raw.http_response.text))
    parsed = raw.parse()
    assert isinstance(parsed, Message) and parsed.id == f"msg_{raw.headers['X-Job-Id']}"
    return parsed


def test_a_plain_message(client, served_model):
    answer = created(client, model=served_model, max_tokens=6, system="Be terse.", messages=ASK)
    assert answer.type == "message" and answer.role == "assistant" and answer.model == served_model
    assert answer.stop_reason in ("end_turn", "max_tokens") and 0 < answer.usage.output_tokens <= 6
    assert [block.type for block in answer.content] in (["text"], [])
    counted = client.messages.count_tokens(model=served_model, system="Be terse.", messages=ASK)
    assert counted.input_tokens == answer.usage.input_tokens + answer.usage.cache_read_input_tokens > 5


def test_a_streamed_message(client, served_model):
    with client.messages.stream(model=served_model, max_tokens=8, messages=ASK,
                                extra_body={"temperature": 0.7, "top_k": 5, "seed": 3}) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens") and 0 < final.usage.output_tokens <= 8
    assert "".join(pieces) == "".join(block.text for block in final.content)
    assert final.id.startswith("msg_") and final.usage.input_tokens + final.usage.cache_read_input_tokens > 5


def test_a_tool_round_trip(client, served_model):
    tools = [WEATHER]
    first = created(client, model=served_model, max_tokens=40, messages=ASK, tools=tools,
                    tool_choice={"type": "tool", "name": "get_weather"})
    [call] = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, CITY)
    turns = ASK + [{"role": "assistant", "content": first.content},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                 "content": "21 C, sunny"}]}]
    second = created(client, model=served_model, max_tokens=6, messages=turns, tools=tools,
                      tool_choice={"type": "none"})
    assert second.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in second.content)
    counted = client.messages.count_tokens(model=served_model, messages=turns, tools=tools,
                                           tool_choice={"type": "none"})
    assert counted.input_tokens == second.usage.input_tokens + second.usage.cache_read_input_tokens
    forced = client.messages.count_tokens(model=served_model, messages=ASK, tools=tools,
                                          tool_choice={"type": "tool", "name": "get_weather"})
    assert forced.input_tokens == first.usage.input_tokens + first.usage.cache_read_input_tokens


def test_a_streamed_call_is_put_together_by_the_client(client, served_model):
    with client.messages.stream(model=served_model, max_tokens=40, messages=ASK, tools=[WEATHER],
                                tool_choice={"type": "any"}) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    [call] = [block for block in final.content if block.type == "tool_use"]
    jsonschema.validate(call.input, CITY)
    assert final.stop_reason == "tool_use" and "input_json" in kinds and kinds[-1] == "message_stop"


def test_errors_come_in_anthropics_shape(client, served_model):
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=served_model, max_tokens=6, messages=ASK,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert refused.value.body["error"]["message"].startswith("thinking: not supported")
    with pytest.raises(anthropic.BadRequestError) as unknown:
        client.messages.create(model=served_model, max_tokens=6, messages=ASK, extra_body={"top_logprobs": 2})
    assert unknown.value.body["error"]["message"].startswith("top_logprobs: unknown field")


def test_a_claude_name_is_the_one_model_served(client, served_model):
    answer = created(client, model="claude-sonnet-4-5", max_tokens=4, messages=ASK)
    assert answer.model == served_model and answer.usage.output_tokens > 0


@pytest.fixture(scope="module")
def keyed_url(surface_stack, base_url):
    proc, url = started_web(surface_stack, MINISERVE_API_KEYS=KEY, MINISERVE_WEB_WORKERS="1")
    yield url
    proc.kill()  # teardown: no graceful stop is under test here


def test_x_api_key_is_the_key(keyed_url, served_model):
    with anthropic.Anthropic(base_url=keyed_url, api_key=KEY, max_retries=0, timeout=60) as keyed:
        assert created(keyed, model=served_model, max_tokens=4, messages=ASK).usage.output_tokens > 0
    with anthropic.Anthropic(base_url=keyed_url, api_key="wrong", max_retries=0, timeout=60) as wrong:
        with pytest.raises(anthropic.AuthenticationError) as denied:
            wrong.messages.count_tokens(model=served_model, messages=ASK)
    assert denied.value.body["error"]["type"] == "authentication_error"
