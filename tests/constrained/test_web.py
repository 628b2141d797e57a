"""Structured-output requests in the web (fakeredis, fake worker): what is stored for the
worker, and every bad or hostile grammar refused with a 4xx naming the field, fast."""
from __future__ import annotations

import json

import pytest

from core.grammar import Constraint
from tests.harness.bounded import returns
from tests.web.conftest import celery, client, make_app, redis_client, run_job, store  # noqa: F401  (fixtures)

USER = [{"role": "user", "content": "Give me JSON."}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}


def chat(client, **body):  # noqa: F811
    return client.post("/v1/chat/completions", json={"messages": USER, **body})


def stored_constraint(store, response) -> Constraint | None:  # noqa: F811
    raw = store.get(response.headers["X-Job-Id"]).request.get("constraint")
    return Constraint.from_dict(raw) if raw else None


def schema_format(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


@pytest.mark.parametrize("body,kind", [
    ({"response_format": {"type": "json_object"}}, "json_object"),
    ({"response_format": schema_format(WEATHER)}, "json_schema"),
    ({"guided_choice": ["yes", "no"]}, "choice"),
    ({"guided_regex": "[0-9]{3}"}, "regex"),
    ({"tools": [TOOL], "tool_choice": "required"}, "tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tools"),
    ({"tools": [TOOL]}, "tools"),
])
def test_the_job_carries_the_grammar(client, store, celery, body, kind):  # noqa: F811
    celery.runner = lambda job_id: run_job(store, job_id)
    response = chat(client, **body)
    assert response.status_code == 200, response.get_json()
    constraint = stored_constraint(store, response)
    assert constraint.kind == kind
    assert constraint.lazy == (kind == "tools" and "tool_choice" not in body)


def test_text_format_and_tool_choice_none_carry_no_grammar(client, store, celery):  # noqa: F811
    celery.runner = lambda job_id: run_job(store, job_id)
    assert stored_constraint(store, chat(client, response_format={"type": "text"})) is None
    assert stored_constraint(store, chat(client, tools=[TOOL], tool_choice="none")) is None


def test_jobs_and_generate_take_response_format(client, store, celery):  # noqa: F811
    response = client.post("/jobs", json={"prompt": "hi", "response_format": {"type": "json_object"}})
    assert response.status_code == 202, response.get_json()
    assert store.get(response.get_json()["id"]).request["constraint"]["kind"] == "json_object"
    celery.runner = lambda job_id: run_job(store, job_id)
    response = client.post("/generate", json={"prompt": "hi", "guided_choice": ["a", "b"]})
    assert response.status_code == 200
    bad = client.post("/jobs", json={"prompt": "hi", "response_format": schema_format({"type": "nope"})})
    assert bad.status_code == 422 and bad.get_json()["error"]["field"] == "response_format.json_schema.schema"
    agent = client.post("/jobs", json={"type": "agent", "prompt": "hi", "response_format": {"type": "json_object"}})
    assert agent.status_code == 422


def deep_schema(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("body,param,words", [
    ({"response_format": schema_format({"type": "objekt"})}, "response_format.json_schema.schema", "valid JSON Schema"),
    ({"response_format": schema_format({"type": "object", "dependentSchemas": {"a": {}}})},
     "response_format.json_schema.schema", "dependentSchemas"),
    ({"response_format": schema_format({"$ref": "#/$defs/missing"})}, "response_format.json_schema.schema", ""),
    ({"response_format": schema_format(deep_schema(25))}, "response_format.json_schema.schema", "deeper"),
    ({"response_format": schema_format({"enum": [f"v{i:06d}" for i in range(20_000)]})},
     "response_format.json_schema.schema", "bytes"),
    ({"response_format": schema_format({"type": "array", "minItems": 100_000, "items": {"type": "integer"}})},
     "response_format.json_schema.schema", "minItems 100000"),
    ({"guided_regex": "(a"}, "guided_regex", "regex"),
    ({"guided_choice": []}, "guided_choice", ""),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_regex", "only one"),
    ({"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format", ""),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "patternProperties": {"^x": {}}, "dependentRequired": {"a": ["b"]}}}}]},
     "tools.0.function.parameters", "dependentRequired"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", ""),
])
def test_bad_and_hostile_grammars_are_400s_naming_the_field(client, celery, body, param, words):  # noqa: F811
    response = returns(lambda: chat(client, **body))
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"] or "").startswith(param.split(".")[0]) and param in (error["param"] + "." + error["message"])
    assert words in error["message"]
    assert celery.sent == []


def test_a_pathological_regex_is_bounded(client, store, celery):  # noqa: F811
    """Accepted or refused, but answered at once (the worker's compile has the same limits)."""
    celery.runner = lambda job_id: run_job(store, job_id)
    response = returns(lambda: chat(client, guided_regex="(a|aa)*(a{1,1000}){1,1000}b"))
    assert response.status_code in (200, 400)


def streamed(client, store, celery, text: str, **body):  # noqa: F811
    """Events of a streamed chat whose fake worker writes ``text`` in 5-character pieces."""
    chunks = [text[i:i + 5] for i in range(0, len(text), 5)]
    celery.runner = lambda job_id: run_job(store, job_id, chunks=chunks, payload={
        "text": text, "finish_reason": "stop", "method": "paged", "usage": {}, "timings": {}})
    response = chat(client, stream=True, **body)
    return [json.loads(line[6:]) for line in response.get_data(as_text=True).split("\n")
            if line.startswith("data: {")]


def tool_deltas(events) -> list[dict]:
    return [d for e in events for c in e["choices"] for d in c["delta"].get("tool_calls", [])]


def joined_arguments(deltas) -> list:
    args: dict[int, str] = {}
    for delta in deltas:
        args[delta["index"]] = args.get(delta["index"], "") + delta["function"]["arguments"]
    return [json.loads(a) for a in args.values()]


def test_forced_tool_calls_stream_as_deltas(client, store, celery):  # noqa: F811
    text = ('{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '{"name": "get_weather", "arguments": {"city": "Rome"}}')
    events = streamed(client, store, celery, text, tools=[TOOL], tool_choice="required")
    deltas = tool_deltas(events)
    assert joined_arguments(deltas) == [{"city": "Paris"}, {"city": "Rome"}]
    assert len(deltas) > 4  # the arguments came piece by piece, not in one closing chunk
    assert [d["function"]["name"] for d in deltas if "id" in d] == ["get_weather", "get_weather"]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_auto_streams_a_bare_call_as_deltas_and_holds_text_back(client, store, celery):  # noqa: F811
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    deltas = tool_deltas(streamed(client, store, celery, " " + call, tools=[TOOL]))
    assert len(deltas) > 2 and joined_arguments(deltas) == [{"city": "Paris"}]
    events = streamed(client, store, celery, "Let me look.\n<tool_call>\n" + call + "\n</tool_call>", tools=[TOOL])
    held = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("tool_calls")]
    assert len(held) == 1 and joined_arguments(tool_deltas(held)) == [{"city": "Paris"}]  # one closing chunk
    events = streamed(client, store, celery, "It is sunny.", tools=[TOOL])
    assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"]) == "It is sunny."
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_auto_json_that_answers_stays_content_and_a_spaced_call_still_streams(client, store, celery):  # noqa: F811
    answer = '{"city": "Paris", "temperature": 21}'
    events = streamed(client, store, celery, answer, tools=[TOOL])
    assert not tool_deltas(events)
    assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"]) == answer
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    spaced = '{\n  "name" : "get_weather", "arguments": {"city": "Rome"}}'
    deltas = tool_deltas(streamed(client, store, celery, spaced, tools=[TOOL]))
    assert len(deltas) > 2 and joined_arguments(deltas) == [{"city": "Rome"}]


def test_auto_stores_the_name_rule_for_the_worker(client, store, celery):  # noqa: F811
    celery.runner = lambda job_id: run_job(store, job_id)  # the chat ends at once (no 5 s wait timeout)
    constraint = stored_constraint(store, chat(client, tools=[TOOL]))
    assert constraint.lazy and "get_weather" in constraint.trigger_regex and not constraint.start_triggers


def test_a_grammar_the_worker_cannot_compile_is_a_400_not_a_500(client, store, celery):  # noqa: F811
    from core.events import FAILED

    celery.runner = lambda job_id: run_job(store, job_id, chunks=(), state=FAILED, payload={
        "code": "grammar_error", "message": "json_schema grammar: NoExtensionBias"})
    response = chat(client, response_format=schema_format({"$ref": "#"}))
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "grammar_error"
