"""The tool_choice case set and its scoring (``bench.tool_choice``), no model: the set is what
the benchmark claims (>= 40 cases, English and Chinese, each kind, each tool), and each
outcome is told apart on answers written by hand; then the mode runs on the tiny model."""
from __future__ import annotations

from collections import Counter

import pytest

from bench import tool_choice
from bench.evaluate_agent import parse_args

TOOLS, CASES = tool_choice.load()
BY_ID = {c.id: c for c in CASES}


def test_the_case_set_covers_each_kind_language_and_tool():
    assert len(CASES) >= 40 and len(BY_ID) == len(CASES)
    assert {(c.kind, c.lang) for c in CASES} == {(k, lang) for k in ("no_tool", "json_answer", "call")
                                                  for lang in ("en", "zh")}
    wanted = Counter(c.expect["name"] for c in CASES if c.expect)
    assert set(wanted) == {t["function"]["name"] for t in TOOLS} and min(wanted.values()) >= 4
    assert all((c.expect is None) == (c.kind != "call") for c in CASES)


@pytest.mark.parametrize("case_id,text,expected", [
    ("no-tool-en-1", "Jane Austen wrote it.", "ok"),
    ("no-tool-zh-1", '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}}\n</tool_call>',
     "unwanted_call"),
    ("json-answer-en-1", '{"name": "Ada", "age": 36, "city": "London"}', "ok"),
    ("call-en-1", "It is probably sunny.", "missed_call"),
    ("call-en-1", '{"name": "get_weather", "arguments": {"location": "Paris, France"}}', "ok"),
    ("call-en-1", '{"name": "get_weather", "arguments": {"location": "Lyon"}}', "wrong_arguments"),
    ("call-en-1", '{"name": "calculator", "arguments": {"expression": "1+1"}}', "wrong_tool"),
    ("call-en-4", '{"name": "calculator", "arguments": {"expression": "1234 × 5678"}}', "ok"),
    ("call-en-4", '{"name": "calculator", "arguments": {"expression": "1234 * 567"}}', "wrong_arguments"),
    ("call-zh-7", '{"name": "convert_currency", "arguments": {"amount": 1000, "from_currency": "CNY", '
                  '"to_currency": "USD"}}', "ok"),
    ("call-zh-7", '{"name": "convert_currency", "arguments": {"amount": 100, "from_currency": "CNY", '
                  '"to_currency": "USD"}}', "wrong_arguments"),
])
def test_each_outcome_is_told_apart(case_id, text, expected):
    assert tool_choice.score(TOOLS, BY_ID[case_id], text)["outcome"] == expected


def test_the_summary_counts_against_what_was_wanted():
    rows = [tool_choice.score(TOOLS, BY_ID["no-tool-en-1"], '{"name": "calculator", "arguments": {"expression": "2"}}'),
            tool_choice.score(TOOLS, BY_ID["call-en-1"], "no idea")]
    summary = tool_choice.summarize(rows)
    assert (summary["unwanted_calls"], summary["missed_calls"], summary["ok"]) == (1, 1, 0)
    assert (summary["no_call_wanted"], summary["call_wanted"]) == (1, 1)


def test_the_mode_has_its_own_defaults():
    args = parse_args(["--tool-choice"])
    assert (args.output, args.max_new_tokens, args.method) == ("results/tool_choice.json", 40, "paged")
    assert parse_args([]).max_new_tokens == 128


def test_both_rules_run_on_the_engine(tiny_engine):
    rows = [r for rule in tool_choice.RULES
            for r in tool_choice.run_rule(tiny_engine, TOOLS, CASES[:3], rule, 6, "paged", batch=3)]
    assert [r["rule"] for r in rows] == ["brace"] * 3 + ["name"] * 3
    assert all(r["outcome"] in tool_choice.OUTCOMES and r["tokens"] <= 6 for r in rows)
