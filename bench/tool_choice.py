"""``tool_choice: auto`` on the project's own cases (``data/tool_choice_cases.json``): does the
model call only when a call is wanted, under the name rule and the older brace rule?

A mode of ``python -m bench.evaluate_agent --tool-choice``. Each case is one ``/v1``-shaped
turn (the tools in the chat template, the lazy tool-call grammar of ``core.grammar``, greedy),
run on the engine in batches; the answer is read by ``web.openai.tool_calls.recognise``, the
function ``/v1/chat/completions`` uses. Per rule, over the cases:

- ``unwanted_calls``: a call came back where none was wanted (no-tool and JSON-answer questions);
- ``missed_calls``: no call where one was wanted;
- ``wrong_tool`` / ``wrong_arguments``: a call to another tool, or one whose arguments fail the
  case's checks (a city named, the calculator's value, an amount and currency codes).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from core import grammar
from core.grammar import ToolSpec

CASES_PATH = Path(__file__).resolve().parent.parent / "data" / "tool_choice_cases.json"
RULES = ("brace", "name")  # the older rule first: "before" and "after"
OUTCOMES = ("ok", "unwanted_call", "missed_call", "wrong_tool", "wrong_arguments")


@dataclass(frozen=True)
class Case:
    id: str
    kind: str            # no_tool | json_answer | call
    lang: str            # en | zh
    prompt: str
    expect: dict[str, Any] | None  # None: no call wanted


def load(path: Path = CASES_PATH) -> tuple[list[dict[str, Any]], list[Case]]:
    raw = json.loads(path.read_text(encoding="utf-8"))
    return raw["tools"], [Case(**c) for c in raw["cases"]]


def constraint_for(tools: list[dict[str, Any]], rule: str) -> grammar.Constraint:
    """The grammar ``/v1`` attaches for ``tool_choice: auto`` (parallel calls allowed)."""
    specs = [ToolSpec(t["function"]["name"], t["function"].get("parameters") or dict(grammar.EMPTY_OBJECT))
             for t in tools]
    return grammar.tool_calls(specs, parallel=True, lazy=True, trigger=rule)  # type: ignore[arg-type]


def _check(value: Any, rule: dict[str, Any]) -> bool:
    from tools.calculator import evaluate
    from tools.registry import ToolError

    if "contains_any" in rule:
        return isinstance(value, str) and any(w.lower() in value.lower() for w in rule["contains_any"])
    if "equals" in rule:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == rule["equals"]
    if "evaluates_to" in rule:
        try:
            return isinstance(value, str) and abs(evaluate(value) - rule["evaluates_to"]) < 1e-6
        except (ToolError, TypeError, ValueError, ZeroDivisionError, OverflowError):
            return False
    raise ValueError(f"unknown argument check {rule}")


def outcome(case: Case, calls: list[Any]) -> str:
    """One of OUTCOMES for what ``recognise`` returned (``calls``: its ToolCall list)."""
    if case.expect is None:
        return "unwanted_call" if calls else "ok"
    if not calls:
        return "missed_call"
    call = calls[0]
    if call.name != case.expect["name"]:
        return "wrong_tool"
    checks = case.expect.get("arguments") or {}
    ok = all(_check(call.arguments.get(key), rule) for key, rule in checks.items())
    return "ok" if ok else "wrong_arguments"


def score(tools: list[dict[str, Any]], case: Case, text: str) -> dict[str, Any]:
    from web.openai.tool_calls import compile_tools, recognise

    answer = recognise(text, compile_tools(tools))
    return {"id": case.id, "kind": case.kind, "lang": case.lang, "outcome": outcome(case, answer.calls),
            "calls": [c.name for c in answer.calls], "text": text}


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    rows = list(rows)
    counts = {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES}
    by_kind = {k: {o: sum(r["outcome"] == o for r in rows if r["kind"] == k) for o in OUTCOMES}
               for k in sorted({r["kind"] for r in rows})}
    no_tool = [r for r in rows if r["kind"] != "call"]
    return {"cases": len(rows), "no_call_wanted": len(no_tool), "call_wanted": len(rows) - len(no_tool),
            "unwanted_calls": counts["unwanted_call"], "missed_calls": counts["missed_call"],
            "wrong_tool": counts["wrong_tool"], "wrong_arguments": counts["wrong_arguments"],
            "ok": counts["ok"], "by_kind": by_kind}


def warm(engine: Any, tools: list[dict[str, Any]], case: Case, method: str) -> None:
    """One token of one case first, so the tools' long system prompt is in the paged pool's
    prefix cache before the batches share it (the comparison is about calls, not prefill)."""
    from engine.types import GenerationRequest, SamplingParams

    engine.generate(GenerationRequest(messages=[{"role": "user", "content": case.prompt}], tools=tools, method=method,
                                      sampling=SamplingParams(max_new_tokens=1, temperature=0.0)))


def run_rule(engine: Any, tools: list[dict[str, Any]], cases: list[Case], rule: str, max_new_tokens: int,
             method: str, batch: int) -> list[dict[str, Any]]:
    """Every case under ``rule``, ``batch`` at a time through the engine loop (greedy)."""
    from engine.types import GenerationRequest, SamplingParams

    constraint = constraint_for(tools, rule)
    rows: list[dict[str, Any]] = []
    for start in range(0, len(cases), batch):
        chunk = cases[start:start + batch]
        began = time.perf_counter()
        handles = [engine.loop.submit(GenerationRequest(
            messages=[{"role": "user", "content": c.prompt}], tools=tools, method=method, constraint=constraint,
            sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))) for c in chunk]
        results = [h.result() for h in handles]
        wall = time.perf_counter() - began
        for case, result in zip(chunk, results):
            rows.append({"rule": rule, **score(tools, case, result.text), "finish_reason": result.finish_reason,
                         "tokens": result.usage.completion_tokens, "batch_wall_s": round(wall, 2)})
        print(json.dumps({"rule": rule, "done": len(rows), "of": len(cases), "batch_wall_s": round(wall, 1)}),
              flush=True)
    return rows


def format_table(summaries: dict[str, dict[str, Any]]) -> str:
    head = f"{'rule':<7}{'cases':>6}{'unwanted calls':>16}{'missed calls':>14}{'wrong tool':>12}{'wrong args':>12}{'ok':>5}"
    lines = [head, "-" * len(head)]
    for rule, s in summaries.items():
        lines.append(f"{rule:<7}{s['cases']:>6}{s['unwanted_calls']:>11} / {s['no_call_wanted']:<2}"
                     f"{s['missed_calls']:>9} / {s['call_wanted']:<2}{s['wrong_tool']:>12}{s['wrong_arguments']:>12}"
                     f"{s['ok']:>5}")
    return "\n".join(lines)
