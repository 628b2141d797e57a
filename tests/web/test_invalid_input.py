"""Input the web must refuse with a JSON 4xx, never a 500, checked in one place (the body
guard, ``find_job``) for every route: lone surrogates in every string field the OpenAPI
document lists, bodies that are JSON but not an object (a JSON string holding JSON),
nesting past 64 levels in a tool schema, and job ids of the wrong shape."""
from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from core import keys
from tests.web.test_json_depth import body_routes

SURROGATE = "\ud800"
Path = tuple[Any, ...]


def _resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def string_paths(schema: dict[str, Any], spec: dict[str, Any], path: Path = (), seen: frozenset = frozenset()
                 ) -> Iterator[Path]:
    """Every path to a string-typed value the schema describes (array items at index 0,
    free-form objects under a key ``k``); each named schema is entered once per path."""
    name = schema.get("$ref")
    if name in seen:
        return
    seen = seen | {name} if name else seen
    schema = _resolve(schema, spec)
    for branch in schema.get("anyOf", []) + schema.get("oneOf", []) + schema.get("allOf", []):
        yield from string_paths(branch, spec, path, seen)
    if schema.get("type") == "string" or isinstance(schema.get("const"), str) or \
            any(isinstance(v, str) for v in schema.get("enum", [])):
        yield path
    for key, prop in schema.get("properties", {}).items():
        yield from string_paths(prop, spec, (*path, key), seen)
    if isinstance(schema.get("items"), dict):
        yield from string_paths(schema["items"], spec, (*path, 0), seen)
    if schema.get("type") == "object" and not schema.get("properties"):
        yield (*path, "k")


def body_at(path: Path, value: Any) -> Any:
    for part in reversed(path):
        value = [value] if isinstance(part, int) else {part: value}
    return value


def body_fields(app) -> list[tuple[str, Path]]:
    spec = app.api_doc
    cases = []
    for route, operations in spec["paths"].items():
        content = operations.get("post", {}).get("requestBody", {}).get("content", {})
        if "application/json" in content:
            paths = set(string_paths(content["application/json"]["schema"], spec))
            cases += [(route, path) for path in sorted(paths, key=str) if path]
    return cases


def test_the_document_lists_the_string_fields_of_every_body(client):
    fields = {(route, ".".join(map(str, path))) for route, path in body_fields(client.application)}
    assert {("/jobs", "prefix"), ("/jobs", "system"), ("/jobs", "messages.0.content"), ("/generate", "prompt"),
            ("/v1/chat/completions", "messages.0.content"), ("/v1/chat/completions", "tools.0.function.name"),
            ("/v1/chat/completions", "messages.0.tool_calls.0.function.arguments")} <= fields
    assert len(fields) > 40


def test_a_lone_surrogate_in_every_string_field_is_a_4xx_naming_it(client, celery, store):
    cases = body_fields(client.application)
    for route, path in cases:
        for text in (SURROGATE, f"ok {SURROGATE[0]}", "\udfff and more"):
            response = client.post(route, data=json.dumps(body_at(path, text)), content_type="application/json")
            error = response.get_json()["error"]
            expected = ".".join(map(str, path))
            if route.startswith("/api/"):  # Ollama's shape: {"error": "<field>: message"}, 400
                assert response.status_code == 400 and error.startswith(f"{expected}: not valid Unicode"), error
                continue
            assert response.status_code == (400 if route.startswith("/v1/") else 422), (route, path, error)
            assert error.get("field", error.get("param")) == expected, (route, path, error)
            assert error["code"] == "validation_error" and "not valid Unicode" in error["message"]
    assert celery.sent == [] and store.client.zcard(keys.JOBS_INDEX) == 0


def test_invalid_text_in_keys_and_raw_bytes_is_422(client, celery):
    response = client.post("/jobs", data='{"prompt": "x", "\\udc80": 1}', content_type="application/json")
    assert response.status_code == 422 and response.get_json()["error"]["field"] == "\\udc80"
    response = client.post("/jobs", data=b'{"prompt": "caf\xe9"}', content_type="application/json")  # latin-1
    assert response.status_code == 422 and response.get_json()["error"]["field"] == "prompt"
    response = client.post("/jobs", data=b'{"prompt": "\xed\xa0\x80"}', content_type="application/json")  # CESU
    assert response.status_code == 422 and response.get_json()["error"]["field"] == "prompt"
    assert celery.sent == []


def test_a_surrogate_inside_tool_call_arguments_is_422_naming_them(client, celery):
    arguments = json.dumps({"x": "\\ud800"}).replace("\\\\", "\\")  # the arguments' own JSON escapes it
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "user", "content": "go on"}]
    response = client.post("/v1/chat/completions", json={"messages": messages})
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["error"]["param"] == "messages[0].tool_calls[0].function.arguments"
    assert celery.sent == []


def test_paired_surrogates_are_text(client, celery):
    response = client.post("/jobs", data='{"prompt": "ok \\ud83d\\ude00"}', content_type="application/json")
    assert response.status_code == 202 and len(celery.sent) == 1


@pytest.mark.parametrize("body", [json.dumps(json.dumps({"prompt": "x"})), '"x"', "[]", "[{}]", "1", "true", "null"])
def test_a_body_that_is_not_an_object_is_422_on_every_route(client, celery, store, body):
    for path in body_routes(client.application):
        response = client.post(path, data=body, content_type="application/json")
        error = response.get_json()["error"]
        if path.startswith("/api/"):  # Ollama's shape: {"error": "message"}, 400
            assert response.status_code == 400 and error.startswith("body: ") and "must be a JSON object" in error
            continue
        assert response.status_code == (400 if path.startswith("/v1/") else 422), (path, error)
        assert error.get("field", error.get("param")) == "body" and "must be a JSON object" in error["message"]
    assert celery.sent == [] and store.client.zcard(keys.JOBS_INDEX) == 0


def test_a_tool_schema_150_deep_is_400_not_a_recursion_error(client, celery):
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(150):
        schema = {"type": "object", "properties": {"a": schema}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    for data in (json.dumps(body), json.dumps(json.dumps(body))):
        response = client.post("/v1/chat/completions", data=data, content_type="application/json")
        assert response.status_code == 400 and response.get_json()["error"]["code"] in ("json_too_deep",
                                                                                        "validation_error")
    response = client.post("/jobs", json={"prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})
    assert response.status_code == 400 and response.get_json()["error"]["code"] == "json_too_deep"
    assert celery.sent == []


@pytest.mark.parametrize("suffix", [":events", ":cancel", ":live", "%3Aevents", "%25", "%", "x" * 5000, "",
                                    ":events/events"])
def test_ids_not_of_a_job_ids_shape_are_404_before_any_key(client, store, suffix):
    job_id = client.post("/jobs", json={"prompt": "hi"}).get_json()["id"]
    store.request_cancel(job_id)  # its hash, stream and cancel flag all exist
    text = f"{job_id}{suffix}" if suffix else "A" * 32
    for method, path in (("get", f"/jobs/{text}"), ("get", f"/jobs/{text}/events"), ("post", f"/jobs/{text}/cancel")):
        response = getattr(client, method)(path)
        assert response.status_code == 404, (path[:80], response.get_json())
        assert response.get_json()["error"]["code"] in ("job_not_found", "not_found")


def test_key_builders_refuse_what_is_not_a_job_id():
    good = keys.JobId("0" * 32)
    assert keys.job_key(good) == f"job:{good}" and keys.events_key(good) == f"job:{good}:events"
    assert keys.JobId(good) is good
    for bad in ("0" * 31, "0" * 33, "0" * 31 + ":", "G" * 32, "a" * 32 + "\n", 7, None, f"{good}:events"):
        for build in (keys.JobId, keys.job_key, keys.events_key, keys.live_channel, keys.cancel_key):
            with pytest.raises(keys.InvalidJobId):
                build(bad)


def test_the_body_is_parsed_once(client, celery, monkeypatch):
    """The guard's parse is the one routes get (flask-openapi3 does not parse the bytes again)."""
    import json as json_module
    real_loads, seen = json_module.loads, []

    def counting_loads(text, *args, **kwargs):
        if "parsed-once" in (text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)):
            seen.append(text)
        return real_loads(text, *args, **kwargs)

    monkeypatch.setattr(json_module, "loads", counting_loads)
    response = client.post("/jobs", data=json.dumps({"prompt": "parsed-once"}), content_type="application/json")
    assert response.status_code == 202 and len(seen) == 1
