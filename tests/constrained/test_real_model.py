"""The real default model under a grammar, as CPU workers serve it by default (q8; slow, bounded:
two short answers)."""
from __future__ import annotations

import json

import jsonschema
import pytest

from core.tool_calls import parse_tool_calls
from core import grammar
from core.grammar import ToolSpec
from engine.types import GenerationRequest, SamplingParams

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
CALC = {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 40}},
        "required": ["expression"], "additionalProperties": False}


def openai_tools(tools: list[ToolSpec]) -> list[dict]:
    return [{"type": "function", "function": {"name": t.name, "parameters": t.parameters}} for t in tools]


def ask(engine, text: str, constraint, tools: list[ToolSpec] | None = None) -> str:
    """As /v1 runs it: the tools are in the prompt (the chat template) and in the grammar."""
    result = engine.generate(GenerationRequest(messages=[{"role": "user", "content": text}], method="paged",
                                               tools=openai_tools(tools) if tools else None, constraint=constraint,
                                               sampling=SamplingParams(max_new_tokens=40)))
    assert result.finish_reason == "stop", result.text
    return result.text


@pytest.mark.slow
def test_real_model_json_schema_and_required_tool_call(real_engine_q8):
    answer = json.loads(ask(real_engine_q8, "Weather report for Paris in celsius, as JSON.", grammar.json_schema(WEATHER)))
    jsonschema.validate(answer, WEATHER)
    tools = [ToolSpec("get_weather", WEATHER), ToolSpec("calculator", CALC)]
    text = ask(real_engine_q8, "What is the weather in Paris?", grammar.tool_calls(tools, parallel=False), tools)
    calls = parse_tool_calls(text, known_tools=["get_weather", "calculator"]).calls
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(calls[0].arguments, WEATHER)


@pytest.mark.slow
def test_real_model_auto_call_is_a_valid_call_of_a_declared_function(real_engine_q8):
    """The lazy grammar: the model starts its call as it likes; the rest is held valid."""
    tools = [ToolSpec("get_weather", WEATHER), ToolSpec("calculator", CALC)]
    request = GenerationRequest(
        messages=[{"role": "user", "content": "What is the weather in Paris?"}], method="paged",
        tools=openai_tools(tools),
        constraint=grammar.tool_calls(tools, parallel=False, lazy=True), sampling=SamplingParams(max_new_tokens=48))
    text = real_engine_q8.generate(request).text
    calls = parse_tool_calls(text, known_tools=["get_weather", "calculator"]).calls
    assert calls, text
    for call in calls:
        assert call.name in ("get_weather", "calculator")
        jsonschema.validate(call.arguments, WEATHER if call.name == "get_weather" else CALC)
