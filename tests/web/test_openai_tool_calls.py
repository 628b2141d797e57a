"""Recognising and validating tool calls for ``/v1/chat/completions`` (pure functions)."""
from __future__ import annotations

import json

import pytest

from web.errors import ApiError
from web.openai.tool_calls import compile_tools, openai_tool_calls, recognise

CALC = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
NOTE = {"type": "function", "function": {"name": "retrieve_note"}}  # no parameters: any object


def tools(**kw):
    return compile_tools([CALC, NOTE], **kw)


@pytest.mark.parametrize("text, content", [
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>', None),
    ('Let me compute.\n```json\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n```', "Let me compute."),
    ('{"name": "calculator", "arguments": "{\\"expression\\": \\"2+2\\"}"}', None),  # arguments as JSON text
    ('{"name": "calculator", "parameters": {"expression": "2+2"}', None),  # truncated, "parameters" key
])
def test_every_shape_the_model_writes_is_recognised(text, content):
    found = recognise(text, tools())
    assert [(c.name, c.arguments) for c in found.calls] == [("calculator", {"expression": "2+2"})]
    assert found.content == content


def test_a_function_without_parameters_takes_any_object():
    found = recognise('{"name": "retrieve_note", "arguments": {"query": "x"}}', tools())
    assert found.calls[0].name == "retrieve_note"


@pytest.mark.parametrize("text, reason", [
    ('{"name": "shell", "arguments": {"cmd": "ls"}}', "not a declared function"),
    ('{"name": "calculator", "arguments": {"expression": 4}}', "is not of type 'string'"),
    ('{"name": "calculator", "arguments": {}}', "'expression' is a required property"),
])
def test_undeclared_functions_and_invalid_arguments_are_refused(text, reason):
    found = recognise(text, tools())
    assert found.calls == [] and found.content == text
    assert reason in found.rejected[0]


def test_plain_text_is_content():
    assert recognise("The answer is 4.", tools()).content == "The answer is 4."
    assert recognise("The answer is 4.", tools()).rejected == []


def test_named_choice_accepts_only_that_function():
    text = '{"name": "retrieve_note", "arguments": {"query": "x"}}'
    assert recognise(text, tools(only="calculator")).calls == []
    assert recognise(text, tools(only="retrieve_note")).calls[0].name == "retrieve_note"


def test_compile_rejects_bad_schemas_duplicates_and_unknown_choice():
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
    with pytest.raises(ApiError) as info:
        compile_tools([CALC, bad])
    assert info.value.field == "tools.1.function.parameters"
    with pytest.raises(ApiError) as info:
        compile_tools([CALC, CALC])
    assert info.value.field == "tools.1.function.name"
    with pytest.raises(ApiError) as info:
        compile_tools([CALC], only="other")
    assert info.value.field == "tool_choice"


def test_openai_shape_has_json_text_arguments_and_unique_ids():
    found = recognise('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
                      '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>', tools())
    calls = openai_tool_calls(found.calls, "abc123")
    assert [c["id"] for c in calls] == ["call_abc123_0", "call_abc123_1"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"expression": "1+1"}, {"expression": "2*3"}]
