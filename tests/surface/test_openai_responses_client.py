"""The real ``openai`` client's ``responses`` API against the running service (redis-server,
a Celery worker with the tiny random model, gunicorn web): plain and streamed, a function
tool and its output item, structured output, retrieve and previous_response_id. Answers are
checked against the client's own types (strict validation of the raw JSON, not only its
lenient parse). Random weights write valid calls and JSON only because of the grammar."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
        "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": CITY}
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def created(client, **body) -> Response:
    """``responses.create``, its raw JSON validated strictly against the client's type."""
    raw = client.responses.with_raw_response.create(**body)
    Response.model_validate(json.loads(raw.text))
    parsed = raw.parse()
    assert isinstance(parsed, Response) and parsed.id == f"resp_{raw.headers['X-Job-Id']}"
    return parsed


def test_a_plain_response(client, served_model):
    answer = created(client, model=served_model, input="Say hello.", instructions="Be terse.", max_output_tokens=6)
    assert answer.status in ("completed", "incomplete") and answer.object == "response"
    assert [item.type for item in answer.output] == ["message"]
    assert answer.usage.output_tokens <= 6 and answer.usage.input_tokens > 5
    assert answer.output_text == answer.output[0].content[0].text
    assert client.responses.retrieve(answer.id).output_text == answer.output_text


def test_a_streamed_response(client, served_model):
    stream = client.responses.create(model=served_model, input="Tell me a story.", max_output_tokens=8, stream=True)
    events = list(stream)
    for event in events:
        EVENTS.validate_python(event.model_dump(mode="json", exclude_unset=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text and final.usage.output_tokens <= 8


def test_a_function_tool_call_and_its_output(client, served_model):
    first = created(client, model=served_model, input="What is the weather in Paris?", tools=[WEATHER],
                    tool_choice="required", max_output_tokens=40)
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and first.status == "completed"
    jsonschema.validate(json.loads(call.arguments), CITY)
    second = created(client, model=served_model, previous_response_id=first.id, tools=[WEATHER],
                     input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}],
                     max_output_tokens=6)
    assert second.previous_response_id == first.id and second.usage.input_tokens > first.usage.input_tokens


def test_a_streamed_call_sends_its_arguments(client, served_model):
    stream = client.responses.create(model=served_model, input="Weather?", tools=[WEATHER],
                                     tool_choice={"type": "function", "name": "get_weather"},
                                     max_output_tokens=40, stream=True)
    events = list(stream)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert len(done) == 1 and deltas == done[0].arguments
    jsonschema.validate(json.loads(done[0].arguments), CITY)
    assert events[-1].type == "response.completed"


def test_structured_output_follows_the_schema(client, served_model):
    answer = created(client, model=served_model, input="Pick a city.", max_output_tokens=40,
                     text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}})
    assert answer.status == "completed"
    jsonschema.validate(json.loads(answer.output_text), CITY)


def test_refused_fields_are_400s_naming_them(client, served_model):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=served_model, input="x", reasoning={"effort": "high"})
    assert info.value.body["param"] == "reasoning" and "not supported" in info.value.body["message"]
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=served_model, input="x", previous_response_id="resp_" + "0" * 32)
    assert info.value.body["param"] == "previous_response_id"


def test_a_background_response_is_polled_to_its_end(client, served_model):
    from tests.harness.stack import wait_until

    started = created(client, model=served_model, input="Count to three.", max_output_tokens=6, background=True)
    assert started.background is True and started.status in ("queued", "in_progress", "completed", "incomplete")
    wait_until(lambda: client.responses.retrieve(started.id).status in ("completed", "incomplete"), 60,
               what="the background response to end")
    assert client.responses.retrieve(started.id).usage.output_tokens <= 6
