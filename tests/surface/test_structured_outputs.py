"""Structured outputs through the whole service with the real ``openai`` client (real
redis-server, Celery worker, gunicorn web) on the tiny RANDOM-weight model: only the grammar
can make its answers valid, so every one of them must parse and validate, streamed or not.

24 prompt/schema cases (nested objects, enums, integers, numbers, booleans, arrays), half
plain and half streamed, for each of json_schema, tool_choice required and a named function
(plus json_object). Requests go 8 at a time, so the worker batches them. Strings carry
``maxLength`` so a random walk ends within ``max_tokens``; sampling is seeded, so each run
is the same run.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

S = {"type": "string", "maxLength": 6}
INT = {"type": "integer", "minimum": 0, "maximum": 999}


def obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": required or list(props), "additionalProperties": False}


SCHEMAS = {
    "weather": obj({"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}}),
    "calculator": obj({"expression": S}),
    "search": obj({"query": S, "max_results": INT, "safe": {"type": "boolean"}}),
    "person": obj({"name": S, "age": INT, "email": S}, ["name", "age"]),
    "address": obj({"street": S, "city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
    "order": obj({"customer": obj({"name": S, "vip": {"type": "boolean"}}),
                  "items": {"type": "array", "minItems": 1, "maxItems": 3,
                            "items": obj({"sku": S, "quantity": {"type": "integer", "minimum": 1, "maximum": 9}})},
                  "priority": {"enum": ["low", "normal", "high"]}}),
    "rating": obj({"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "comment": S}),
    "tags": obj({"tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4}}),
    "point": obj({"x": {"type": "number", "minimum": -100, "maximum": 100}, "y": {"type": "number"}}),
    "event": obj({"title": S, "day": {"type": "string", "pattern": "^2026-[01][0-9]-[0-3][0-9]$"},
                  "attendees": {"type": "array", "items": S, "maxItems": 3}}),
    "matrix": obj({"rows": {"type": "array", "maxItems": 3, "items": {"type": "array", "maxItems": 3, "items": INT}}}),
    "flag": obj({"enabled": {"type": "boolean"}, "level": {"enum": [1, 2, 3]}}),
}
PROMPTS = ["What's the weather in Paris?", "Compute 12 * (3 + 4).", "Find papers on paged attention.",
           "Describe Ada, 36, ada@example.com.", "Where is the Louvre?", "Order two apples for Bob.",
           "Rate this film.", "Tag this picture.", "Where is the treasure?", "Plan a meeting on May 3rd.",
           "Give me a small matrix.", "Should the feature be on?"]
CASES = list(zip(SCHEMAS, PROMPTS)) + list(zip(SCHEMAS, reversed(PROMPTS)))  # 24 prompt/schema pairs
TOOLS = [{"type": "function", "function": {"name": name, "description": f"the {name} tool", "parameters": schema}}
         for name, schema in SCHEMAS.items()]
MAX_TOKENS = 200
STREAMS = [(False, CASES[0::2]), (True, CASES[1::2])]  # every case once, plain or streamed


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def ask(client, i: int, prompt: str, stream: bool, max_tokens: int = MAX_TOKENS, **body):
    kwargs = dict(model="",  # empty: the cluster's default model (its only one)
                  messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                  temperature=1.0, seed=i, **body)
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return choice.message.content, calls, choice.finish_reason
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            name, args = calls.get(call.index, ("", ""))
            calls[call.index] = (name + (call.function.name or ""), args + (call.function.arguments or ""))
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def ask_all(client, seed: int, stream: bool, cases, body_for) -> list:
    """Every case at once (8 in flight): ``body_for(name)`` gives the request's extra fields."""
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda item: ask(client, seed + item[0], item[1][1], stream, **body_for(item[1][0])),
                             enumerate(cases)))


@pytest.mark.parametrize("stream,cases", STREAMS, ids=["plain", "streamed"])
def test_json_schema_answers_parse_and_validate(client, stream, cases):
    def body(name):
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}}
    for (name, _), (content, _, finish) in zip(cases, ask_all(client, 0, stream, cases, body)):
        assert finish == "stop", (name, content)
        jsonschema.validate(json.loads(content), SCHEMAS[name])


@pytest.mark.parametrize("stream,cases", STREAMS, ids=["plain", "streamed"])
def test_json_object_answers_are_objects(client, stream, cases):
    answers = ask_all(client, 100, stream, cases[:3],
                      lambda _: {"response_format": {"type": "json_object"}, "max_tokens": 120})
    finished = [content for content, _, finish in answers if finish == "stop"]
    assert finished  # a free-form object may be cut by max_tokens; a finished one must parse
    for content in finished:
        assert isinstance(json.loads(content), dict), content


def _check_calls(calls, only: str | None = None) -> None:
    assert calls
    for name, arguments in calls:
        assert name in SCHEMAS and (only is None or name == only)
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("stream,cases", STREAMS, ids=["plain", "streamed"])
def test_tool_choice_required_always_calls_a_declared_function(client, stream, cases):
    body = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    for content, calls, finish in ask_all(client, 200, stream, cases, lambda _: body):
        assert finish == "tool_calls" and len(calls) == 1 and not content
        _check_calls(calls)


@pytest.mark.parametrize("stream,cases", STREAMS, ids=["plain", "streamed"])
def test_a_named_function_is_always_the_one_called(client, stream, cases):
    def body(name):
        return {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": name}}}
    for (name, _), (content, calls, finish) in zip(cases, ask_all(client, 300, stream, cases, body)):
        assert finish == "tool_calls" and not content
        _check_calls(calls, only=name)


def test_guided_choice_and_regex_extensions(client):
    for i in range(4):
        content, _, _ = ask(client, 400 + i, "Yes or no?", False, extra_body={"guided_choice": ["yes", "no"]})
        assert content in ("yes", "no")
        content, _, _ = ask(client, 400 + i, "A code?", False, extra_body={"guided_regex": "[A-Z]{3}-[0-9]{2}"})
        assert len(content) == 6 and content[3] == "-"


def test_an_unsupported_schema_is_a_400_listing_the_feature(client, served_model):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=served_model, messages=[{"role": "user", "content": "x"}], response_format=fmt)
    assert "dependentSchemas" in str(caught.value) and caught.value.status_code == 400
