import json

import pytest

from agent.evaluation import CATEGORIES, Case, check_answer, load_cases, run_case, summarize
from agent.eval_report import write_outputs
from bench.evaluate_agent import format_table, parse_args
from tests.agent.fakes import ScriptedModel, call
from tools import create_default_registry


@pytest.fixture(scope="module")
def registry():
    return create_default_registry()


def test_shipped_cases_cover_every_category_in_both_languages():
    cases = load_cases()
    assert len(cases) >= 40 and len({c.id for c in cases}) == len(cases)
    for category in CATEGORIES:
        langs = {c.lang for c in cases if c.category == category}
        assert langs == {"zh", "en"}, category
    for case in cases:
        assert case.answer_check
        assert (case.expected_tool is None) == (case.category == "direct_answer")


def test_load_cases_filters():
    assert {c.category for c in load_cases(categories=["tool_error"])} == {"tool_error"}
    assert len(load_cases(limit=3)) == 3
    with pytest.raises(ValueError):
        load_cases(categories=["nope"])


@pytest.mark.parametrize("spec, text, ok", [
    ({"numbers": [963]}, "The result is 963.", True),
    ({"numbers": [963]}, "The result is 96.3", False),
    ({"numbers": [864198]}, "It is 864,198.", True),
    ({"numbers": [14.7]}, "3.5 * 4.2 = 14.700000000000001", True),
    ({"numbers": [7, 30]}, "7 and 35", False),
    ({"any": ["paris"]}, "Paris.", True),
    ({"all": ["def ", "return"]}, "def f(x): return x * x", True),
    ({"all": ["def ", "return"]}, "def f(x): x * x", False),
    ({"any": ["x"]}, "", False),
])
def test_check_answer(spec, text, ok):
    assert check_answer(spec, text) is ok


def _case(**overrides) -> Case:
    raw = {"id": "t", "category": "calculator", "lang": "en", "prompt": "What is (48 + 12) / 5?",
           "expected_tool": "calculator", "tool_check": {"numbers": [12]}, "answer_check": {"numbers": [12]}}
    return Case.from_dict({**raw, **overrides})


def test_raw_routing_and_safeguarded_routing_are_separate(registry):
    case = _case(category="wrong_tool", prompt="Use retrieve_note to compute 23 * 47",
                 tool_check={"numbers": [1081]}, answer_check={"numbers": [1081]})
    record = run_case(ScriptedModel([call("retrieve_note", query="23 * 47"), "It is 1081."]), registry, case)
    assert record["model_tool"] == "retrieve_note" and record["tool"] == "calculator"
    assert not record["raw_routing_ok"] and record["routing_ok"] and record["tool_ok"] and record["e2e_ok"]
    assert record["safeguards"] == "reroute_to_calculator" and record["failure"] == ""


def test_wrong_answer_and_failures_are_classified(registry):
    record = run_case(ScriptedModel([call("calculator", expression="(48 + 12) / 5"), "It is 13."]),
                      registry, _case())
    assert record["tool_ok"] and not record["e2e_ok"] and record["failure"] == "wrong_answer"
    record = run_case(ScriptedModel(["<tool_call>{bad</tool_call>"]), registry, _case())
    assert record["status"] == "malformed_tool_call" and record["failure"] == "wrong_tool"
    crashed = run_case(ScriptedModel([]), registry, _case())
    assert crashed["failure"] == "crashed" and "AssertionError" in crashed["error"]


def test_retrieval_checks(registry):
    case = _case(category="irrelevant_retrieval", prompt="Search my notes for mapo tofu",
                 expected_tool="retrieve_note", tool_check={"no_notes": True}, answer_check={"any": ["no "]})
    record = run_case(ScriptedModel([call("retrieve_note", query="mapo tofu"), "There are no notes on it."]),
                      registry, case)
    assert record["tool_ok"] and record["e2e_ok"]
    case = _case(category="retrieval", prompt="What is RoPE?", expected_tool="retrieve_note",
                 tool_check={"note": "KV Cache"}, answer_check={"any": ["rotat"]})
    record = run_case(ScriptedModel([call("retrieve_note", query="RoPE"), "It rotates."]), registry, case)
    assert record["tool_ok"] is False and record["failure"] == "wrong_tool_result"


def test_summary_and_outputs(registry, tmp_path):
    records = [
        run_case(ScriptedModel([call("calculator", expression="(48 + 12) / 5"), "12"]), registry, _case()),
        run_case(ScriptedModel(["Hi!"]), registry, _case(id="d", category="direct_answer", prompt="Hello",
                                                         expected_tool=None, tool_check=None,
                                                         answer_check={"any": ["hi"]})),
    ]
    summary = summarize(records)
    assert summary["overall"]["cases"] == 2 and summary["overall"]["end_to_end"] == 1.0
    assert summary["overall"]["tool_result_cases"] == 1
    assert list(summary["categories"]) == ["calculator", "direct_answer"]
    assert summary["categories"]["direct_answer"]["tool_result"] is None
    summary["run"] = {"model": "fake"}
    paths = write_outputs(records, summary, tmp_path / "eval.csv")
    assert paths["png"].stat().st_size > 0
    assert json.loads(paths["json"].read_text())["overall"]["routing"] == 1.0
    assert "calculator" in format_table(summary)


def test_cli_arguments():
    args = parse_args(["--category", "calculator", "--category", "tool_error", "--limit", "2", "--celery"])
    assert args.category == ["calculator", "tool_error"] and args.limit == 2 and args.celery


def test_refused_invented_tool_counts_as_no_tool(registry):
    case = _case(id="d", category="direct_answer", prompt="把“早上好”翻译成英文。", expected_tool=None,
                 tool_check=None, answer_check={"any": ["good morning"]})
    record = run_case(ScriptedModel([call("translate", text="早上好"), "Good morning"]), registry, case)
    assert record["model_tool"] == "translate" and record["tool"] is None
    assert not record["raw_routing_ok"] and record["routing_ok"] and record["e2e_ok"]
