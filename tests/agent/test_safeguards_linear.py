"""Prompt analysis does bounded work (issue 15, item 1): it runs in the worker beside other
jobs, so a hostile prompt must not freeze it. The old patterns took ~4.4 s on 32,000 dashes
(quadratic backtracking: about an hour on 1 MB).

What is asserted is the work the analysis decides to do, counted: how many runs it looks at,
how many candidates it parses and how many characters those hold, whatever the prompt's size.
The regex scan itself (C code, no counter) has one CPU-time bound, a 30 s safety net that a
linear scan of 1 MB (under a second) never nears and a quadratic one (an hour) never meets."""
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


SAFETY_CPU_S = 30.0  # a safety net (see above), never the measure


class Work:
    """What one analysis did: runs the scan handed to Python, candidates parsed, their characters."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs = self.parsed = self.chars = 0
        pattern, balance = safeguards._RUN_RE, safeguards._balance

        class Counting:
            def finditer(_self, text):
                for match in pattern.finditer(text):
                    self.runs += 1
                    yield match

        def counted_balance(expr: str) -> str:
            self.parsed += 1
            self.chars += len(expr)
            return balance(expr)

        monkeypatch.setattr(safeguards, "_RUN_RE", Counting())
        monkeypatch.setattr(safeguards, "_balance", counted_balance)


def test_32000_dashes_hand_python_no_run_at_all(monkeypatch):
    work = Work(monkeypatch)
    assert analyze_prompt("-" * 32_000).expressions == ()
    assert (work.runs, work.parsed) == (0, 0)  # no digit: the scan passes over it, nothing to parse


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_megabyte_prompt_costs_bounded_work(name, monkeypatch):
    prompt = HOSTILE[name]()
    assert len(prompt) >= 0.99 * MB
    work = Work(monkeypatch)
    started = time.thread_time()
    facts = analyze_prompt(prompt)
    assert time.thread_time() - started < SAFETY_CPU_S, name
    assert work.runs <= safeguards.MAX_RUNS + 1, name
    assert work.parsed <= safeguards.MAX_CANDIDATES, name
    assert work.chars <= safeguards.MAX_CANDIDATES * safeguards.MAX_CANDIDATE_CHARS, name
    assert len(facts.expressions) <= safeguards.MAX_EXPRESSIONS


def test_work_does_not_grow_with_the_text_past_the_caps(monkeypatch):
    """Ten times the text, the same work once the caps are reached (quadratic would be a hundred times)."""
    counts = []
    for text in ("-x(1+" * 20_000, "-x(1+" * 200_000):
        work = Work(monkeypatch)
        analyze_prompt(text)
        counts.append((work.runs, work.parsed, work.chars))
    assert counts[0] == counts[1]


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
