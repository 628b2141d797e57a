"""Prompt analysis runs in linear time (issue 15, item 1): it runs in the worker beside other
jobs, so a hostile prompt must not freeze it. The old patterns took ~4.4 s on 32,000 dashes
(quadratic backtracking); 1 MB now takes well under a second.

Times are thread CPU time, so a busy CI machine does not make the bound flaky."""
from __future__ import annotations

import random
import re
import time

import pytest

from agent import safeguards
from agent.safeguards import analyze_prompt, find_expressions

MB = 1_000_000
HOSTILE = {  # name -> builder (built only when its test runs)
    "dashes": lambda: "-" * MB,
    "open_brackets": lambda: "(" * MB,
    "search_words": lambda: "search " * (MB // 7),
    "notes_lines": lambda: "notes\n" * (MB // 6),
    "distinct_sums": lambda: "".join(f"{i}+{i + 1}, " for i in range(MB // 12)),
    "broken_sums": lambda: "".join(f"1+ {i}.x " for i in range(MB // 10)),
    "operator_soup": lambda: "".join(random.Random(0).choices("0123456789+-*/()（）. x\n", k=MB)),
    "one_long_sum": lambda: ("1+" * 100 + "1 ") * (MB // 203),
    "dash_x": lambda: "-x" * (MB // 2),
    "digits": lambda: "1 " * (MB // 2),
    "newlines": lambda: "\n" * MB,
}


def cpu_seconds(fn, *args) -> float:
    started = time.thread_time()
    fn(*args)
    return time.thread_time() - started


def test_32000_dashes_take_milliseconds():
    assert cpu_seconds(analyze_prompt, "-" * 32_000) < 0.05


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_megabyte_prompt_is_analysed_well_under_a_second(name):
    prompt = HOSTILE[name]()
    assert len(prompt) >= 0.99 * MB
    assert cpu_seconds(analyze_prompt, prompt) < 0.8, name


def test_time_grows_linearly():
    """Ten times the text, about ten times the work (quadratic would be a hundred)."""
    small, big = "-x(1+" * 20_000, "-x(1+" * 200_000
    ratio = min(cpu_seconds(analyze_prompt, big) for _ in range(2)) / \
        max(min(cpu_seconds(analyze_prompt, small) for _ in range(3)), 1e-4)
    assert ratio < 30


def test_expressions_are_still_found_after_a_hostile_prefix():
    facts = analyze_prompt("-" * 100_000 + " 请计算 (125 * 8) - 37")
    assert facts.expressions == ("(125 * 8) - 37",) and facts.computation_intent


_OLD_CANDIDATE = re.compile(r"[0-9.(（+\-−][0-9.\s+\-−*/%()×÷^（）]*[0-9)）]")


def _old_find(text: str) -> list[str]:
    """The previous (quadratic) algorithm, kept as the reference for short texts."""
    found: list[str] = []
    for match in _OLD_CANDIDATE.finditer(text):
        start, end = match.span()
        if safeguards._glued_to_word(text, start, end):
            continue
        expr = safeguards._balance(match.group().strip())
        if expr and safeguards.is_arithmetic(expr) and expr not in found:
            found.append(expr)
    return found


def test_same_expressions_as_the_old_pattern_on_short_texts():
    rng = random.Random(15)
    alphabet = "0123456789+-*/()（）. x−×÷^%\nab="
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert find_expressions(text) == _old_find(text), text


@pytest.mark.parametrize("prompt, asks", [
    ("search my notes for RoPE", True), ("notes: please search them", True),
    ("check the notes", True), ("search\nnotes", False), ("知识库里有什么", True), ("what is RoPE", False),
])
def test_asks_for_notes(prompt, asks):
    assert analyze_prompt(prompt).asks_for_notes is asks
