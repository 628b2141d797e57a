"""The real ``openai`` client against the app in-process (``httpx2.WSGITransport``) with a
fake worker whose answer is a tool call: the client parses ``tool_calls`` from both the
plain and the streamed answer. (The tiny random model of the service tests never writes a
tool call, so this is where a recognised call goes through the client end to end.)"""
from __future__ import annotations

import json

import httpx2
import openai
import pytest

from core.model_source import DEFAULT_MODEL_NAME

from tests.web.conftest import run_job

CALC = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
ASK = [{"role": "user", "content": "What is 17 * 23?"}]
ANSWER = 'I will compute it.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'


@pytest.fixture
def openai_client(make_app, store, celery):
    app = make_app()
    http = httpx2.Client(transport=httpx2.WSGITransport(app=app), base_url="http://miniserve")
    celery.runner = lambda job_id: run_job(store, job_id, chunks=[ANSWER[:20], ANSWER[20:]])
    with openai.OpenAI(base_url="http://miniserve/v1", api_key="x", http_client=http, max_retries=0) as client:
        yield client


def test_the_client_gets_a_validated_tool_call(openai_client):
    reply = openai_client.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=ASK, tools=[CALC])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will compute it."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "17 * 23"}


def test_the_client_assembles_a_streamed_tool_call(openai_client):
    chunks = list(openai_client.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=ASK, tools=[CALC], stream=True))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name) for tc in calls] == [(0, "calculator")]
    assert json.loads(calls[0].function.arguments) == {"expression": "17 * 23"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_an_undeclared_function_reaches_the_client_as_content(openai_client):
    other = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    reply = openai_client.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=ASK, tools=[other])
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == ANSWER and reply.choices[0].finish_reason == "length"
