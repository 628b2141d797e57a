"""The answer turn: how tool results are shown to the model, and the last-resort answer.

With the tool-call history in Qwen's own format in view, the 0.5B model answers a tool
result by calling the tool again. Shown the same results as plain text in one user turn
(no tools offered), it writes an answer. The full tool-call history is still what the
trace records and what a later tool turn sees.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from tools.retriever import parse_notes
from tools.text import is_cjk

MAX_NOTE_CHARS = 600


def answer_messages(answer_prompt: str, prompt: str, steps: Sequence[Any]) -> list[dict[str, str]]:
    lines = [f"- {_describe_call(s)}: {_describe_result(s)}" for s in steps if s.tool_name]
    header = "工具结果：" if is_cjk(prompt) else "Tool results:"
    return [{"role": "system", "content": answer_prompt},
            {"role": "user", "content": f"{prompt}\n\n{header}\n" + "\n".join(lines)}]


def fallback_answer(prompt: str, steps: Sequence[Any]) -> str:
    """Answer from the last tool result when the model will not stop calling tools."""
    zh = is_cjk(prompt)
    last = next((s for s in reversed(steps) if s.tool_name), None)
    if last is None:
        return ""
    if not last.success:
        return f"工具调用失败：{last.error}" if zh else f"The tool failed: {last.error}"
    if last.tool_name == "retrieve_note":
        notes = parse_notes(last.result)
        if not notes:
            return "笔记中没有找到相关内容。" if zh else "No relevant notes were found."
        return f"{notes[0]['title']}: {notes[0]['body']}"
    return f"结果是 {last.result}。" if zh else f"The result is {last.result}."


def _describe_call(step: Any) -> str:
    if step.tool_name == "calculator" and isinstance(step.arguments, dict):
        return f"calculator({step.arguments.get('expression', '')})"
    return f"{step.tool_name}({json.dumps(step.arguments, ensure_ascii=False)})"


def _describe_result(step: Any) -> str:
    if not step.success:
        return f"ERROR: {step.error}"
    if step.tool_name == "retrieve_note":
        notes = parse_notes(step.result)
        if not notes:
            return "no relevant notes found"
        return " ".join(f"[{n['title']}] {n['body'][:MAX_NOTE_CHARS]}" for n in notes)
    return step.result
