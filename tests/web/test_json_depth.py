"""JSON nested 1000 levels deep is a 400 naming the problem, never a 500 (issue 15, item 4):
in the body of every endpoint that takes one, and in a chat message's tool-call arguments."""
from __future__ import annotations

import json

import pytest

from core import keys
from web.json_depth import MAX_JSON_DEPTH, JsonTooDeep, depth, parse_json

DEEP = "[" * 1000 + "]" * 1000
DEEPER = '{"a":' * 50_000 + "1" + "}" * 50_000


def body_routes(app) -> list[str]:
    """Every route that accepts a POST body, with a made-up id where the path needs one."""
    paths = []
    for rule in app.url_map.iter_rules():
        if "POST" in rule.methods:
            paths.append(rule.rule.replace("<job_id>", "abc"))
    return sorted(paths)


def test_every_post_route_is_covered(client):
    assert {"/jobs", "/generate", "/agent/run", "/bench", "/v1/chat/completions", "/jobs/abc/cancel"} <= \
        set(body_routes(client.application))


@pytest.mark.parametrize("nested", [DEEP, DEEPER, "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH])
def test_deep_body_is_400_on_every_endpoint(client, celery, store, nested):
    body = '{"prompt": %s}' % nested  # one level more than ``nested``
    for path in body_routes(client.application):
        response = client.post(path, data=body, content_type="application/json")
        assert response.status_code == 400, (path, response.status_code, response.get_json())
        error = response.get_json()["error"]
        if isinstance(error, str):                      # Ollama's shape: {"error": "<message>"}
            assert "nested more than" in error, (path, error)
        elif "type" in error and "code" not in error:   # Anthropic's: {"type": "error", "error": {"type", "message"}}
            assert error["type"] == "invalid_request_error" and "nested more than" in error["message"], (path, error)
        else:
            assert error["code"] == "json_too_deep" and "nested more than" in error["message"], (path, error)
    assert celery.sent == [] and store.client.zcard(keys.JOBS_INDEX) == 0


def test_tool_call_arguments_nested_too_deep_are_400_naming_the_field(client, celery):
    messages = [{"role": "user", "content": "add"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "add", "arguments": DEEP}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "3"}]
    response = client.post("/v1/chat/completions", json={"messages": messages})
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "json_too_deep" and error["type"] == "invalid_request_error"
    assert error["param"] == "messages[1].tool_calls[1].function.arguments"
    assert celery.sent == []


def test_nesting_at_the_limit_is_accepted(make_app, celery):
    client = make_app(wait_timeout_s=1).test_client()
    value = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)  # inside {"x": ...}: exactly the limit
    response = client.post("/v1/chat/completions", json={"messages": [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": %s}' % value}}]},
        {"role": "user", "content": "go on"}]})
    assert response.status_code == 504  # accepted and queued; nobody runs it in this test
    assert len(celery.sent) == 1


def test_depth_is_measured_without_recursion():
    assert depth(1) == 0 and depth([]) == 1 and depth({"a": [1, {"b": []}]}) == 4
    assert parse_json('{"a": [[1]]}') == {"a": [[1]]}
    with pytest.raises(JsonTooDeep):
        parse_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(JsonTooDeep):
        parse_json(DEEPER)
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
