import json

import pytest

from agent import COMPLETED, MALFORMED, MAX_STEPS, AgentRunner
from agent.runner import REPEATED
from tests.agent.fakes import ScriptedModel, call
from tools import create_default_registry


@pytest.fixture(scope="module")
def registry():
    return create_default_registry()


def _run(registry, outputs, prompt, **kwargs):
    model = ScriptedModel(outputs)
    steps = []
    result = AgentRunner(model, registry).run(prompt, on_step=steps.append, **kwargs)
    return result, model, steps


def test_direct_answer(registry):
    result, model, steps = _run(registry, ["Hello! How can I help?"], "Hi there")
    assert result.status == COMPLETED and result.text == "Hello! How can I help?"
    assert result.steps == 0 and result.trace == [] and steps == []
    assert model.requests[0]["tools"][0]["function"]["name"] == "calculator"


def test_tool_success_then_answer(registry):
    result, model, steps = _run(registry, [call("calculator", expression="(125 * 8) - 37"),
                                           "计算结果是 963。"], "请计算 (125 * 8) - 37，并说明结果。")
    assert result.ok and result.text == "计算结果是 963。" and result.steps == 1
    step = result.trace[0]
    assert (step.model_tool_name, step.tool_name, step.result, step.success) == ("calculator", "calculator", "963", True)
    assert not step.safeguard_applied and step.parse_format == "bare"
    assert steps == [step.to_dict()]
    # The history holds the call and its result in Qwen2.5's template shape ...
    assistant, tool = result.messages[-2:]
    assert assistant["tool_calls"][0]["function"] == {"name": "calculator",
                                                      "arguments": {"expression": "(125 * 8) - 37"}}
    assert tool == {"role": "tool", "tool_call_id": "call_1", "name": "calculator", "content": "963"}
    # ... while the answer turn shows the result as plain text, without tools.
    answer_turn = model.requests[1]
    assert answer_turn["tools"] is None and len(answer_turn["messages"]) == 2
    assert "\n(125 * 8) - 37 = 963\n" in answer_turn["messages"][0]["content"]
    assert answer_turn["messages"][1] == {"role": "user", "content": "请计算 (125 * 8) - 37，并说明结果。"}


def test_tool_failure_then_recovery(registry):
    result, model, _ = _run(registry, [call("calculator", expr="2 + 2"), call("calculator", expression="2 + 2"),
                                       "It is 4."], "Add two and two please")
    assert result.ok and result.steps == 2 and result.text == "It is 4."
    first, second = result.trace
    assert not first.success and first.error_kind == "invalid_arguments"
    assert model.requests[1]["messages"][-1]["content"].startswith("Error: ")
    assert second.success and second.result == "4"


def test_tool_error_goes_to_the_answer_turn(registry):
    result, model, _ = _run(registry, [call("calculator", expression="1/0"), "Division by zero is undefined."],
                            "What is 1/0?")
    assert result.ok and not result.trace[0].success and result.trace[0].error == "division by zero"
    assert result.messages[-1]["content"] == "Error: division by zero"
    assert model.requests[1]["tools"] is None
    assert "1/0 cannot be calculated, error: division by zero" in model.requests[1]["messages"][0]["content"]


def test_unknown_tool_is_a_failed_step(registry):
    result, model, _ = _run(registry, [call("web_search", q="news"), "I cannot search the web."], "Any news today?")
    assert result.ok and result.trace[0].error_kind == "unknown_tool" and result.trace[0].tool_name == "web_search"
    assert "no tool named 'web_search'" in model.requests[1]["messages"][0]["content"]


def test_malformed_call_is_a_distinct_outcome(registry):
    result, _, steps = _run(registry, ["<tool_call>{\"name\": calculator}</tool_call>"], "What is 2+3?")
    assert result.status == MALFORMED and not result.ok and result.error
    assert result.trace[0].error_kind == MALFORMED and result.trace[0].tool_name is None
    assert result.steps == 0 and len(steps) == 1


def test_max_steps_exceeded(registry):
    outputs = [call("retrieve_note", query="kv cache"), call("retrieve_note", query="rope"),
               call("retrieve_note", query="gqa")]
    result, _, _ = _run(registry, outputs, "Tell me about the kv cache, rope and gqa", max_steps=2)
    assert result.status == MAX_STEPS and result.steps == 2 and len(result.trace) == 2


def test_several_calls_in_one_output_count_as_steps(registry):
    both = f"<tool_call>{call('calculator', expression='3 + 4')}</tool_call>\n" \
           f"<tool_call>{call('calculator', expression='5 * 6')}</tool_call>"
    result, model, _ = _run(registry, [both, "7 and 30."], "Compute 3 + 4 and 5 * 6")
    assert result.ok and [s.result for s in result.trace] == ["7", "30"]
    messages = result.messages
    assert len(messages[-3]["tool_calls"]) == 2 and [m["role"] for m in messages[-2:]] == ["tool", "tool"]
    assert "\n3 + 4 = 7\n5 * 6 = 30\n" in model.requests[1]["messages"][0]["content"]
    assert result.trace[0].parse_format == "tag"


def test_calls_beyond_the_budget_are_dropped_then_the_model_answers(registry):
    both = f"{call('calculator', expression='3 + 4')}\n{call('calculator', expression='5 * 6')}"
    result, model, _ = _run(registry, [both, "7"], "Compute 3 + 4 and 5 * 6", max_steps=1)
    assert result.ok and result.steps == 1 and result.trace[0].result == "7"
    assert model.requests[1]["tools"] is None


def test_the_same_call_written_many_times_runs_once(registry):
    spam = "\n".join([call("calculator", expression="100 - 58")] * 6)
    result, _, _ = _run(registry, [call("calculator", expression="12 * 12"), spam, "144 and 42"],
                        "分别计算 12 * 12 和 100 - 58")
    assert [s.result for s in result.trace] == ["144", "42"] and result.text == "144 and 42"


def test_tools_are_withheld_once_a_tool_succeeded(registry):
    result, model, _ = _run(registry, [call("retrieve_note", query="RoPE"), "RoPE rotates q and k."],
                            "What is RoPE?")
    assert result.ok and result.finish_reason == "answer"
    assert model.requests[0]["tools"] and model.requests[1]["tools"] is None
    assert model.requests[1]["messages"][0]["content"].startswith("You are a helpful assistant. Answer")
    shown = model.requests[1]["messages"][0]["content"]
    assert 'Note "RoPE (Rotary Position Embedding)": RoPE, rotary' in shown


def test_tools_stay_offered_after_invalid_arguments(registry):
    result, model, _ = _run(registry, [call("calculator", expr="1+1"), call("calculator", expression="1+1"), "2"],
                            "Add one and one")
    assert model.requests[1]["tools"] is not None and model.requests[2]["tools"] is None
    assert model.requests[1]["messages"][-1]["content"].startswith("Error: invalid arguments")


def test_repeated_call_after_failure_asks_for_an_answer(registry):
    again = call("calculator", expr="1+1")
    result, model, _ = _run(registry, [again, again, "It is 2."], "Add one and one")
    assert result.ok and result.finish_reason == REPEATED and result.steps == 1
    assert result.text == "It is 2."
    assert model.requests[2]["tools"] is None  # the last request withholds the tools


def test_several_expressions_keep_tools_until_each_is_computed(registry):
    outputs = [call("calculator", expression="3 + 4"), call("calculator", expression="5 * 6"), "7 and 30"]
    result, model, _ = _run(registry, outputs, "Compute 3 + 4 and 5 * 6")
    assert [s.result for s in result.trace] == ["7", "30"] and result.text == "7 and 30"
    assert [r["tools"] is None for r in model.requests] == [False, False, True]


def test_invented_tool_is_rerouted_to_retrieval(registry):
    result, _, _ = _run(registry, [call("paged KV Cache"), "Blocks."], "Paged KV Cache 如何减少内存浪费？")
    step = result.trace[0]
    assert (step.model_tool_name, step.tool_name, step.safeguards) == \
        ("paged KV Cache", "retrieve_note", ["reroute_to_retrieval"])


def test_made_up_query_is_replaced_by_the_prompt(registry):
    result, _, _ = _run(registry, [call("retrieve_note", query="KV cache"), "Nothing."],
                        "Look up in my notes who won the 2018 World Cup.")
    step = result.trace[0]
    assert step.safeguards == ["query_from_prompt"] and json.loads(step.result)["notes"] == []
    assert step.model_arguments == {"query": "KV cache"}


def test_related_query_is_kept(registry):
    result, _, _ = _run(registry, [call("retrieve_note", query="RoPE"), "Rotation."], "What is RoPE?")
    assert result.trace[0].arguments == {"query": "RoPE"} and not result.trace[0].safeguard_applied


def test_repeated_call_falls_back_to_the_tool_result(registry):
    again = call("calculator", expression="6 * 7")
    result, _, _ = _run(registry, [again, again], "Please multiply 6 * 7")
    assert result.ok and result.finish_reason == REPEATED and result.text == "Results: 6 * 7 = 42."
    result, _, _ = _run(registry, [call("retrieve_note", query="RoPE")] * 2, "什么是 RoPE？")
    assert result.finish_reason == REPEATED
    assert result.text.startswith("RoPE (Rotary Position Embedding): ")


@pytest.mark.parametrize("output", [
    "<tool_call>\n" + call("calculator", expression="9 - 4") + "\n</tool_call>",
    "<tool_call>\n" + call("calculator", expression="9 - 4"),
    "```json\n" + call("calculator", expression="9 - 4") + "\n```",
    call("calculator", expression="9 - 4"),
    json.dumps({"name": "calculator", "arguments": json.dumps({"expression": "9 - 4"})}),
])
def test_each_parse_format_runs_the_tool(registry, output):
    result, _, _ = _run(registry, [output, "5"], "Subtract: nine minus four")
    assert result.ok and result.trace[0].result == "5"


def test_prompt_expression_safeguard(registry):
    result, model, _ = _run(registry, [call("calculator", expression="48 + 12 / 5"), "The answer is 12."],
                            "What is (48 + 12) / 5?")
    step = result.trace[0]
    assert step.model_arguments == {"expression": "48 + 12 / 5"}
    assert step.arguments == {"expression": "(48 + 12) / 5"} and step.result == "12"
    assert step.safeguard_applied and step.safeguards == ["prompt_expression"]
    sent = result.messages[-2]["tool_calls"][0]["function"]["arguments"]
    assert sent == {"expression": "(48 + 12) / 5"}  # history shows what really ran


def test_reroute_safeguard(registry):
    result, _, _ = _run(registry, [call("retrieve_note", query="23 * 47"), "23 * 47 = 1081"],
                        "请用 retrieve_note 工具计算 23 * 47")
    step = result.trace[0]
    assert (step.model_tool_name, step.tool_name, step.result) == ("retrieve_note", "calculator", "1081")
    assert step.safeguards == ["reroute_to_calculator"]


def test_forced_calculator_safeguard(registry):
    result, _, _ = _run(registry, ["17 * 23 = 381", "17 * 23 = 391"], "Calculate 17 * 23")
    step = result.trace[0]
    assert step.model_tool_name is None and step.tool_name == "calculator" and step.result == "391"
    assert step.safeguards == ["forced_calculator"] and result.text == "17 * 23 = 391"


def test_several_expressions_keep_model_arguments(registry):
    result, _, _ = _run(registry, [call("calculator", expression="3 + 4 + 5 * 6"), "37"],
                        "Compute 3 + 4 and 5 * 6")
    step = result.trace[0]
    assert step.arguments == {"expression": "3 + 4 + 5 * 6"} and not step.safeguard_applied


def test_safeguards_can_be_disabled(registry):
    model = ScriptedModel([call("calculator", expression="48 + 12 / 5"), "50.4"])
    result = AgentRunner(model, registry, safeguards=False).run("What is (48 + 12) / 5?")
    assert result.trace[0].result == "50.4" and not result.trace[0].safeguard_applied


def test_on_text_gets_the_final_answer(registry):
    texts = []
    AgentRunner(ScriptedModel(["Bonjour"]), registry).run("Say hello in French", on_text=texts.append)
    assert texts == ["Bonjour"]


def test_forced_retrieval_safeguard(registry):
    result, model, _ = _run(registry, ["RoPE means relative position encoding.", "RoPE rotates q and k."],
                            "What is RoPE?")
    step = result.trace[0]
    assert step.model_tool_name is None and step.tool_name == "retrieve_note"
    assert step.safeguards == ["forced_retrieval"] and step.arguments == {"query": "What is RoPE?"}
    assert json.loads(step.result)["notes"][0]["title"].startswith("RoPE")
    assert result.text == "RoPE rotates q and k."


@pytest.mark.parametrize("prompt", ["What is the capital of France?", "Translate 'good morning' into French"])
def test_no_forced_retrieval_when_the_notes_do_not_answer(registry, prompt):
    result, _, _ = _run(registry, ["An answer."], prompt)
    assert result.trace == [] and result.text == "An answer."


def test_forced_retrieval_for_an_explicit_notes_search(registry):
    result, _, _ = _run(registry, ["Mapo tofu is spicy.", "No notes about it."],
                        "Search my notes for the recipe of mapo tofu.")
    step = result.trace[0]
    assert step.safeguards == ["forced_retrieval"] and json.loads(step.result)["notes"] == []


def test_nothing_found_is_answered_without_the_model(registry):
    result, model, _ = _run(registry, [call("retrieve_note", query="mapo tofu")], "Search my notes for mapo tofu")
    assert result.ok and result.finish_reason == "no_notes" and len(model.requests) == 1
    assert result.text == "No relevant notes were found in the notes."
    result, _, _ = _run(registry, [call("retrieve_note", query="红烧肉")], "请检索笔记：红烧肉怎么做？")
    assert result.text == "笔记中没有找到相关内容。"
