import pytest

from core.tool_calls import ToolCall
from agent.safeguards import (FORCED, PROMPT_EXPRESSION, REROUTE, analyze_prompt, find_expressions,
                              forced_call, guard_call)


@pytest.mark.parametrize("prompt, expressions", [
    ("请计算 (125 * 8) - 37，并说明结果。", ["(125 * 8) - 37"]),
    ("What is (48 + 12) / 5?", ["(48 + 12) / 5"]),
    ("计算（15+5）×3", ["（15+5）×3"]),
    ("Compute 3 + 4 and 5 * 6", ["3 + 4", "5 * 6"]),
    ("Qwen2.5-0.5B 是什么模型？", []),
    ("What is 15% of 80?", []),
    ("100 - 20% of the budget", []),
    ("在 2024-01-05 这天", []),
    ("Explain the KV cache", []),
    ("1/0", ["1/0"]),
])
def test_find_expressions(prompt, expressions):
    assert find_expressions(prompt) == expressions


def test_single_expression_overrides_calculator_arguments():
    facts = analyze_prompt("What is (48 + 12) / 5?")
    decision = guard_call(ToolCall("calculator", {"expression": "48 + 12 / 5"}), facts)
    assert decision.call.arguments == {"expression": "(48 + 12) / 5"}
    assert decision.applied == [PROMPT_EXPRESSION]
    assert decision.original.arguments == {"expression": "48 + 12 / 5"}


def test_same_expression_is_left_alone():
    facts = analyze_prompt("What is (48 + 12) / 5?")
    decision = guard_call(ToolCall("calculator", {"expression": "(48+12)/5"}), facts)
    assert decision.applied == [] and decision.call.arguments == {"expression": "(48+12)/5"}


def test_computation_routed_elsewhere_is_rerouted():
    facts = analyze_prompt("请用 retrieve_note 工具计算 23 * 47")
    decision = guard_call(ToolCall("retrieve_note", {"query": "23 * 47"}), facts)
    assert decision.call == ToolCall("calculator", {"expression": "23 * 47"})
    assert decision.applied == [REROUTE] and decision.original.name == "retrieve_note"


def test_no_reroute_without_computation_intent():
    facts = analyze_prompt("Search my notes for chapter 3-5")
    call = ToolCall("retrieve_note", {"query": "chapter 3-5"})
    assert guard_call(call, facts).call == call


def test_several_expressions_keep_model_arguments():
    facts = analyze_prompt("Compute 3 + 4 and 5 * 6")
    call = ToolCall("calculator", {"expression": "3 + 4 + 5 * 6"})
    decision = guard_call(call, facts)
    assert decision.call == call and decision.applied == []
    assert forced_call(facts) is None


def test_forced_calculator_for_clear_single_computation():
    decision = forced_call(analyze_prompt("Calculate 17 * 23"))
    assert decision.call == ToolCall("calculator", {"expression": "17 * 23"}) and decision.applied == [FORCED]
    assert forced_call(analyze_prompt("Explain the KV cache")) is None


def test_made_up_query_is_replaced_and_related_query_kept():
    from agent.safeguards import QUERY_FROM_PROMPT, Decision, guard_query

    made_up = ToolCall("retrieve_note", {"query": "notes about LLM inference", "top_k": 2})
    decision = guard_query(Decision(made_up, made_up), "请查一下笔记里关于投机解码的内容")
    assert decision.call.arguments == {"query": "请查一下笔记里关于投机解码的内容", "top_k": 2}
    assert decision.applied == [QUERY_FROM_PROMPT]
    related = ToolCall("retrieve_note", {"query": "投机解码"})
    assert guard_query(Decision(related, related), "请查一下笔记里关于投机解码的内容").applied == []
