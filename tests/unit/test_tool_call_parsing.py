import json

import pytest

from core.tool_calls import ToolCall, parse_tool_calls

KNOWN = ["calculator", "retrieve_note"]
CALC = ToolCall("calculator", {"expression": "1+2"})
CALC2 = ToolCall("calculator", {"expression": "3*4"})
BODY = '{"name": "calculator", "arguments": {"expression": "1+2"}}'
BODY2 = '{"name": "calculator", "arguments": {"expression": "3*4"}}'


@pytest.mark.parametrize("text, calls, fmt", [
    (f"<tool_call>\n{BODY}\n</tool_call>", [CALC], "tag"),
    (f"<tool_call>\n{BODY}", [CALC], "tag"),  # missing closing tag
    (f"<tool_call>{BODY}</tool_call>\n<tool_call>{BODY2}</tool_call>", [CALC, CALC2], "tag"),
    (f"<tool_call>{BODY}\n<tool_call>{BODY2}", [CALC, CALC2], "tag"),
    (f"```json\n{BODY}\n```", [CALC], "fenced"),
    (f"```\n{BODY}\n```", [CALC], "fenced"),
    (f"```json\n[{BODY}, {BODY2}]\n```", [CALC, CALC2], "fenced"),
    (f"```json\n{BODY}", [CALC], "fenced"),  # unterminated fence
    (BODY, [CALC], "bare"),
    (f"Let me compute it.\n{BODY}", [CALC], "bare"),
    (f"{BODY}\n{BODY2}", [CALC, CALC2], "bare"),
    (BODY[:-1], [CALC], "bare"),  # missing final brace
    (json.dumps({"name": "calculator", "arguments": json.dumps({"expression": "1+2"})}), [CALC], "bare"),
    ('{"name": "calculator", "parameters": {"expression": "1+2"}}', [CALC], "bare"),
    (json.dumps({"type": "function", "function": {"name": "calculator",
                                                  "arguments": '{"expression": "1+2"}'}}), [CALC], "bare"),
])
def test_every_call_format(text, calls, fmt):
    parsed = parse_tool_calls(text, KNOWN)
    assert not parsed.malformed
    assert parsed.calls == calls
    assert parsed.format == fmt


def test_text_around_calls_is_kept_as_content():
    parsed = parse_tool_calls(f"Sure.\n<tool_call>\n{BODY}\n</tool_call>", KNOWN)
    assert parsed.content == "Sure."


@pytest.mark.parametrize("text", [
    "The answer is 42.",
    "答案是 42。",
    "```python\nprint({'a': 1})\n```",
    'A JSON example: {"a": 1, "b": [1, 2]}',
    '{"name": "Alice", "age": 3}',  # a name that is no tool and no arguments: data, not a call
])
def test_plain_answers_have_no_calls(text):
    parsed = parse_tool_calls(text, KNOWN)
    assert parsed.calls == [] and not parsed.malformed and parsed.content == text.strip()


@pytest.mark.parametrize("text", [
    "<tool_call>{\"name\": calculator, arguments: 1+2}</tool_call>",
    "<tool_call>\nnot json at all\n</tool_call>",
    '{"name": "calculator", "arguments": {"expression": 1+2}}',
    '<tool_call>{"name": "calculator", "arguments": "not json"}</tool_call>',
    '```json\n{"name": "calculator", "arguments": {"expression": }\n```',
])
def test_unreadable_calls_are_malformed(text):
    parsed = parse_tool_calls(text, KNOWN)
    assert parsed.malformed and parsed.calls == [] and parsed.error
