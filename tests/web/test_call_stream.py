"""Where a streamed ``auto`` answer is decided: the head of a call of a declared tool streams
as deltas, anything else (JSON answers included) is held to the end. No server needed."""
from __future__ import annotations

import pytest

from web.openai.call_stream import ToolStream, head_state

NAMES = ["get_weather", "calculator"]


@pytest.mark.parametrize("text,state", [
    ("", "maybe"), ("{", "maybe"), ('{"na', "maybe"), ('{\n  "name" :', "maybe"), ('{"name": "get_w', "maybe"),
    ('{"name": "get_weather"', "call"), ('{ "name":"calculator", "arguments"', "call"),
    ('{"city"', "no"), ('{"name": "Ada"', "no"), ('{"name": "get_weather_x"', "no"), ("[", "no"),
    ("Sure", "no"), ('{"nam e"', "no"),
])
def test_head_state(text, state):
    assert head_state(text, NAMES) == state


def test_an_auto_call_streams_piece_by_piece():
    stream = ToolStream("job1", forced=False, names=NAMES)
    text = '{"name": "calculator", "arguments": {"expression": "2+2"}}'
    deltas = [d for i in range(0, len(text), 3) for d in stream.feed(text[i:i + 3])]
    assert deltas[0]["function"] == {"name": "calculator", "arguments": ""} and stream.streamed
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"expression": "2+2"}'


def test_a_json_answer_is_held_back():
    stream = ToolStream("job1", forced=False, names=NAMES)
    assert [stream.feed(p) for p in ('{"na', 'me": "Ada", ', '"age": 3}')] == [[], [], []]
    assert stream.mode == "held" and not stream.streamed
