"""Agent evaluation: cases, one run per case, judging, and the per-category report.

Pure functions over plain dicts, so the same code runs in-process (``bench.evaluate_agent``)
and as one Celery task per case (``worker.agent_eval_tasks``). The report keeps apart:

* raw routing: the first tool the *model* chose (none for a direct answer) is the expected one;
* routing: the first tool that *ran*, after safeguards, is the expected one;
* tool result: what the tool returned is right (number, note, empty result, error);
* end to end: the run completed and the final answer passes the case's check.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.model import ChatModel
from agent.runner import AgentResult, AgentRunner
from tools import ToolRegistry
from tools.retriever import parse_notes

CASES_PATH = Path(__file__).resolve().parent.parent / "data" / "agent_cases.json"
CATEGORIES = ("calculator", "retrieval", "direct_answer", "wrong_tool", "multiple_expressions",
              "irrelevant_retrieval", "tool_error", "malformed_output")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    lang: str
    prompt: str
    expected_tool: str | None
    tool_check: dict[str, Any] | None
    answer_check: dict[str, Any]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Case":
        return cls(raw["id"], raw["category"], raw["lang"], raw["prompt"], raw.get("expected_tool"),
                   raw.get("tool_check"), raw["answer_check"])

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def load_cases(path: Path = CASES_PATH, categories: list[str] | None = None,
               limit: int | None = None) -> list[Case]:
    cases = [Case.from_dict(c) for c in json.loads(path.read_text(encoding="utf-8"))]
    unknown = set(categories or ()) - set(CATEGORIES)
    if unknown:
        raise ValueError(f"unknown categories: {sorted(unknown)}; choose from {CATEGORIES}")
    if categories:
        cases = [c for c in cases if c.category in categories]
    return cases[:limit] if limit else cases


def run_case(model: ChatModel, registry: ToolRegistry, case: Case, max_steps: int = 3,
             max_new_tokens: int = 128) -> dict[str, Any]:
    """Run one case and judge it; the record is flat (one CSV row) plus the trace."""
    runner = AgentRunner(model, registry, max_steps=max_steps, max_new_tokens=max_new_tokens)
    try:
        result = runner.run(case.prompt)
    except Exception as exc:  # a crashed case is a failed case, not a crashed evaluation
        return judge(case, None, error=f"{type(exc).__name__}: {exc}")
    return judge(case, result)


def judge(case: Case, result: AgentResult | None, error: str | None = None) -> dict[str, Any]:
    # A call to an invented tool that the registry refused ran nothing.
    steps = [s for s in result.trace if s.tool_name and s.error_kind != "unknown_tool"] if result else []
    first = result.trace[0] if result and result.trace else None
    model_tool = first.model_tool_name if first else None
    tool = steps[0].tool_name if steps else None
    tool_ok = check_tool(case, steps) if case.tool_check else None
    text = result.text if result else ""
    e2e = bool(result and result.ok and check_answer(case.answer_check, text))
    record = {
        "id": case.id, "category": case.category, "lang": case.lang, "prompt": case.prompt,
        "expected_tool": case.expected_tool, "model_tool": model_tool, "tool": tool,
        "safeguards": ",".join(g for s in steps for g in s.safeguards),
        "arguments": json.dumps([s.arguments for s in steps], ensure_ascii=False),
        "tool_results": json.dumps([s.result if s.success else f"ERROR: {s.error}" for s in steps],
                                   ensure_ascii=False),
        "status": result.status if result else "crashed",
        "finish_reason": result.finish_reason if result else "crashed",
        "answer": text,
        "raw_routing_ok": model_tool == case.expected_tool,
        "routing_ok": tool == case.expected_tool,
        "tool_ok": tool_ok,
        "e2e_ok": e2e,
        "latency_ms": round(result.latency_ms, 1) if result else 0.0,
        "model_calls": result.model_calls if result else 0,
        "error": error or (result.error if result else None),
    }
    record["failure"] = failure_reason(record)
    record["outputs"] = json.dumps(result.outputs if result else [], ensure_ascii=False)
    record["trace"] = [s.to_dict() for s in result.trace] if result else []
    return record


def check_tool(case: Case, steps: list[Any]) -> bool:
    spec = case.tool_check or {}
    if "numbers" in spec:
        got = [float(s.result) for s in steps if s.success and s.tool_name == "calculator" and _is_float(s.result)]
        return all(any(_close(g, n) for g in got) for n in spec["numbers"])
    if "error" in spec:
        return any(not s.success and s.tool_name == case.expected_tool for s in steps)
    notes = [parse_notes(s.result) for s in steps if s.success and s.tool_name == "retrieve_note"]
    if "no_notes" in spec:
        return bool(notes) and all(n == [] for n in notes)
    if "note" in spec:
        return any(n and n[0]["title"] == spec["note"] for n in notes)
    raise ValueError(f"case {case.id}: unknown tool_check {spec}")


def check_answer(spec: dict[str, Any], text: str) -> bool:
    lower = text.lower()
    ok = True
    if "numbers" in spec:
        found = [float(m.replace(",", "")) for m in _NUMBER_RE.findall(text) if _is_float(m.replace(",", ""))]
        ok &= all(any(_close(f, n) for f in found) for n in spec["numbers"])
    if "any" in spec:
        ok &= any(k.lower() in lower for k in spec["any"])
    if "all" in spec:
        ok &= all(k.lower() in lower for k in spec["all"])
    return bool(ok) and bool(text.strip())


def failure_reason(record: dict[str, Any]) -> str:
    if record["status"] == "crashed":
        return "crashed"
    if not record["routing_ok"]:
        return "wrong_tool"
    if record["tool_ok"] is False:
        return "wrong_tool_result"
    if record["status"] != "completed":
        return record["status"]
    return "" if record["e2e_ok"] else "wrong_answer"


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Overall and per-category rates; ``tool_result`` only over cases that check a tool."""
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_cat.setdefault(r["category"], []).append(r)
    ordered = [c for c in CATEGORIES if c in by_cat] + sorted(set(by_cat) - set(CATEGORIES))
    return {"overall": _rates(records), "categories": {c: _rates(by_cat[c]) for c in ordered}}


def _rates(records: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(records)
    checked = [r for r in records if r["tool_ok"] is not None]
    latencies = [r["latency_ms"] for r in records]
    rate = lambda key, rs: round(sum(bool(r[key]) for r in rs) / len(rs), 4) if rs else None  # noqa: E731
    return {
        "cases": n,
        "raw_routing": rate("raw_routing_ok", records),
        "routing": rate("routing_ok", records),
        "tool_result": rate("tool_ok", checked),
        "tool_result_cases": len(checked),
        "end_to_end": rate("e2e_ok", records),
        "safeguarded_cases": sum(1 for r in records if r["safeguards"]),
        "repeated_call_stops": sum(1 for r in records if r["finish_reason"] == "repeated_call"),
        "latency_ms_mean": round(statistics.fmean(latencies), 1) if latencies else None,
        "latency_ms_p50": round(statistics.median(latencies), 1) if latencies else None,
        "failures": {k: v for k, v in _count(r["failure"] for r in records).items() if k},
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def _is_float(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
