"""The rule that starts a call under ``tool_choice: auto``: a ``<tool_call>`` tag, or JSON whose
first key is ``"name"`` naming a declared tool (bare or fenced). JSON that is an answer stays
text. The regex alone first (no model), then the lazy matcher on the tiny model's tokenizer,
under the name rule and the older brace rule it replaces."""
from __future__ import annotations

import re

import pytest
import torch

from core import grammar
from core.grammar import ToolSpec, call_trigger
from engine.constrained import token_constraint

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
           "required": ["city"], "additionalProperties": False}
CALC = {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 12}},
        "required": ["expression"], "additionalProperties": False}
TOOLS = [ToolSpec("get_weather", WEATHER), ToolSpec("calculator", CALC)]
NAMES = ["get_weather", "calculator"]

CALLS = [  # (text, where the call starts)
    ('{"name": "get_weather", "arguments": {', 0),
    ('  {"name": "calculator"', 2),
    ('{\n  "name" : "get_weather"', 0),
    ('Let me check. {"name": "get_weather", ', 14),
    ('```json\n{"name": "calculator", ', 0),
    ('Sure:\n```\n{"name": "get_weather"', 6),
    ("<tool_call>\n", 0),
    ("好的，我来查一下。<tool_call>", len("好的，我来查一下。".encode())),
]
ANSWERS = [  # JSON and text that answer, not call
    '{"city": "Paris", "temperature": 21}',
    '{"name": "Ada Lovelace", "born": 1815}',
    '{"name": "get_weather_report"}',           # not a declared name
    '{"tool": "get_weather"}',                  # first key is not "name"
    '{"answer": {"tool": "get_weather"}}',
    '```json\n{"items": [1, 2, 3]}\n```',
    "[1, 2, 3]",
    "The set {1, 2} has two items.",
    "北京今天晴，气温二十度。",
    '{"名字": "计算器"}',
]


@pytest.mark.parametrize("text,at", CALLS)
def test_a_call_in_any_form_the_parser_reads_triggers(text, at):
    found = re.compile(call_trigger(NAMES).encode()).search(text.encode())
    assert found is not None and found.start() == at


@pytest.mark.parametrize("text", ANSWERS)
def test_json_that_answers_does_not_trigger(text):
    assert re.compile(call_trigger(NAMES).encode()).search(text.encode()) is None


def test_a_name_that_extends_a_declared_one_does_not_trigger():
    pattern = re.compile(call_trigger(["search", "search_web"]).encode())
    assert pattern.search(b'{"name": "search_webs"') is None
    assert pattern.search(b'{"name": "search_web"').start() == 0
    assert pattern.search(b'{"name": "search"').start() == 0


def test_the_rule_is_carried_by_the_job_and_keyed_apart_from_the_old_one():
    new = grammar.tool_calls(TOOLS, lazy=True)
    old = grammar.tool_calls(TOOLS, lazy=True, trigger="brace")
    assert new.trigger_regex and not new.start_triggers
    assert old.start_triggers == ("{",) and not old.trigger_regex
    assert grammar.Constraint.from_dict(new.to_dict()) == new
    assert new.key != old.key


def _feed(constraint, tokenizer, text: str) -> None:
    for token in tokenizer.encode(text, add_special_tokens=False):
        constraint.accept(token)


@pytest.mark.parametrize("text,_at", CALLS)
def test_the_lazy_matcher_starts_at_a_call_and_holds_it(tiny_engine, text, _at):
    tokenizer = tiny_engine.loaded.tokenizer
    constraint = token_constraint(tiny_engine, grammar.tool_calls(TOOLS, parallel=False, lazy=True))
    _feed(constraint, tokenizer, text)
    assert constraint.active and not constraint.gave_up
    logits = torch.zeros(tiny_engine.loaded.model.config.vocab_size)
    assert 0 < int(torch.isfinite(constraint.mask(logits)).sum()) < logits.numel()


@pytest.mark.parametrize("text", ANSWERS)
def test_the_lazy_matcher_leaves_json_answers_free(tiny_engine, text):
    tokenizer = tiny_engine.loaded.tokenizer
    constraint = token_constraint(tiny_engine, grammar.tool_calls(TOOLS, lazy=True))
    _feed(constraint, tokenizer, text)
    assert not constraint.active


def test_the_old_brace_rule_forced_a_json_answer_into_a_call(tiny_engine):
    """What the name rule fixes: under the brace rule ``{"city"`` opens a call (the matcher
    gives up on a key that no call has, so the answer is then free, but ``{`` alone is
    already held to a call's head)."""
    tokenizer = tiny_engine.loaded.tokenizer
    old = token_constraint(tiny_engine, grammar.tool_calls(TOOLS, lazy=True, trigger="brace"))
    _feed(old, tokenizer, "{")
    assert old.active
    new = token_constraint(tiny_engine, grammar.tool_calls(TOOLS, lazy=True))
    _feed(new, tokenizer, "{")
    assert not new.active


def test_a_trigger_far_into_a_long_answer_is_found(tiny_engine):
    tokenizer = tiny_engine.loaded.tokenizer
    constraint = token_constraint(tiny_engine, grammar.tool_calls(TOOLS, lazy=True))
    _feed(constraint, tokenizer, "word " * 400)
    assert not constraint.active
    _feed(constraint, tokenizer, '{"name": "calculator", "arguments": {"expression": "1+')
    assert constraint.active and not constraint.gave_up
