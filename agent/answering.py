"""The answer turn: how tool results are shown to the model, and the last-resort answer.

With its own tool-call history in Qwen's format in view, the 0.5B model answers a tool
result by calling the tool again; shown the results as a list inside the user turn it
answers with stray numbers. Given the results as plain facts in the system message and the
user's question unchanged, it answers the question. The full tool-call history is still
what the trace records and what a later tool turn sees.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from tools.retriever import parse_notes
from tools.text import is_cjk

MAX_NOTES = 2
MAX_NOTE_CHARS = 500


def answer_messages(answer_prompt: str, prompt: str, steps: Sequence[Any]) -> list[dict[str, str]]:
    zh = is_cjk(prompt)
    facts = "\n".join(describe_step(s, zh) for s in steps if s.tool_name)
    return [{"role": "system", "content": answer_prompt.format(facts=facts)},
            {"role": "user", "content": prompt}]


def describe_step(step: Any, zh: bool = False) -> str:
    """One tool result as a sentence the model can quote (failures in the user's language,
    which the model then repeats instead of inventing a result)."""
    args = step.arguments if isinstance(step.arguments, dict) else {}
    if step.error_kind == "unknown_tool":
        return f"There is no tool named {step.tool_name!r}; answer without it."
    if step.tool_name == "calculator":
        expr = args.get("expression", "")
        if step.success:
            return f"{expr} = {step.result}"
        return f"无法计算 {expr}，错误：{step.error}" if zh else f"{expr} cannot be calculated, error: {step.error}"
    if step.tool_name == "retrieve_note":
        if not step.success:
            return f"Searching the notes failed: {step.error}"
        notes = parse_notes(step.result)[:MAX_NOTES]
        if not notes:
            return "The notes contain nothing relevant to this question."
        return "\n".join(f'Note "{n["title"]}": {n["body"][:MAX_NOTE_CHARS]}' for n in notes)
    outcome = step.result if step.success else f"failed: {step.error}"
    return f"{step.tool_name}({json.dumps(args, ensure_ascii=False)}): {outcome}"


def fallback_answer(prompt: str, steps: Sequence[Any]) -> str:
    """Answer from the tool results when the model will not stop calling tools."""
    zh = is_cjk(prompt)
    ran = [s for s in steps if s.tool_name]
    if not ran:
        return ""
    last = ran[-1]
    if not last.success:
        return f"工具调用失败：{last.error}" if zh else f"The tool failed: {last.error}"
    if last.tool_name == "retrieve_note":
        notes = parse_notes(last.result)
        if not notes:
            return no_notes_answer(prompt)
        return f"{notes[0]['title']}: {notes[0]['body']}"
    results = "；".join(describe_step(s, zh) for s in ran) if zh else "; ".join(describe_step(s) for s in ran)
    return f"结果：{results}。" if zh else f"Results: {results}."


def no_notes_answer(prompt: str) -> str:
    return "笔记中没有找到相关内容。" if is_cjk(prompt) else "No relevant notes were found in the notes."
