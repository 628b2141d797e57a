"""Deterministic corrections between the model's tool call and its execution.

A 0.5B model picks the right tool but rewrites arithmetic (``(48 + 12) / 5`` became
``48 + 12 / 5`` in the original MiniServe), obeys a user who names the wrong tool, or
answers a sum from memory. When the user's prompt holds exactly one unambiguous
arithmetic expression we know what must be computed, so:

* ``prompt_expression``: a calculator call runs the prompt's expression;
* ``reroute_to_calculator``: a call to another tool, with a clear computation intent in
  the prompt, becomes a calculator call on that expression;
* ``forced_calculator``: a first answer without any tool call, for such a prompt, is
  replaced by a calculator call (the model then answers from the result);
* ``forced_retrieval``: a first answer without any tool call to a question (what / how /
  explain / 什么 / 如何 ...) that the notes answer (the retriever finds a relevant note for
  the prompt itself, with its usual relevance threshold), or to an explicit "search my
  notes" request, is replaced by a note lookup: the model otherwise answers "what is RoPE"
  from its own, often wrong, memory;
* ``reroute_to_calculator`` / ``reroute_to_retrieval`` also apply when the model calls a
  tool that does not exist, under the same conditions as the two forced calls;
* ``query_from_prompt``: a ``retrieve_note`` query sharing no word with the prompt (copied
  from an example) is replaced by the prompt.

With several expressions in the prompt nothing is overridden: the model's arguments are
kept. Every correction is recorded in the trace so evaluation can separate what the model
chose (``model_tool_name``) from what ran (``tool_name``).

The analysis runs in time linear in the prompt (a hostile 1 MB prompt takes milliseconds,
and it runs in the worker beside other jobs): candidate runs are found by one regex with no
backtracking, at most :data:`MAX_RUNS` are looked at and :data:`MAX_CANDIDATES` parsed, at most
:data:`MAX_EXPRESSIONS` expressions are kept (the safeguards act only on one), and a
candidate longer than the calculator accepts is never an expression.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from core.tool_calls import ToolCall
from tools.calculator import MAX_CHARS, is_arithmetic, normalize_expression
from tools.text import tokenize

CALCULATOR = "calculator"
PROMPT_EXPRESSION = "prompt_expression"
REROUTE = "reroute_to_calculator"
FORCED = "forced_calculator"
FORCED_RETRIEVAL = "forced_retrieval"
REROUTE_RETRIEVAL = "reroute_to_retrieval"
QUERY_FROM_PROMPT = "query_from_prompt"
RETRIEVE = "retrieve_note"

_OPEN, _CLOSE = "(（", ")）"
# A run of characters an expression may contain. A candidate is the part of a run from its
# first possible start to its last possible end (what ``[start][run]*[end]`` would match,
# found without that pattern's quadratic backtracking on e.g. 32,000 dashes).
# Only runs holding a digit and an operator match; the lookaheads run once per run start
# (``(?<!...)``), so the scan stays linear and blank or digit-free runs cost no Python work.
_RUN_CHARS = r"[0-9.\s+\-−*/%()×÷^（）]"
_RUN_RE = re.compile(rf"(?<!{_RUN_CHARS})(?={_RUN_CHARS}*?[0-9])(?={_RUN_CHARS}*?[+\-−*/%×÷^]){_RUN_CHARS}+")
_STARTS = frozenset("0123456789.(（+-−")
_ENDS = frozenset("0123456789)）")
_OPERATORS = frozenset("+-−*/%×÷^")
MAX_RUNS = 4096           # runs with a digit and an operator looked at per prompt
MAX_CANDIDATES = 256      # candidate runs parsed per prompt
MAX_EXPRESSIONS = 16      # expressions kept (more than one already disables the overrides)
MAX_BALANCE_STEPS = 8     # stray brackets dropped from a candidate's ends
MAX_CANDIDATE_CHARS = MAX_CHARS + MAX_BALANCE_STEPS  # longer: the calculator refuses it anyway
_INTENT_RE = re.compile(
    r"计算|算一下|算算|算出|等于|多少|求值|得数|结果|乘以|除以|加上|减去|"
    r"\b(calculate|compute|evaluate|calc|solve|what\s+is|what's|how\s+much|result|equals?|value)\b|=|的值",
    re.I)
_QUESTION_RE = re.compile(
    r"什么|如何|怎么|为什么|为何|解释|介绍|讲讲|作用|原理|区别|好处|意思|笔记|查|检索|搜索|"
    r"\b(what|how|why|explain|describe|tell\s+me\s+about|search|look\s+up|notes?|difference)\b", re.I)
# "search ... notes" / "notes ... search" on one line, tested in two linear passes (the
# single pattern ``A.*B`` restarts its scan at every A: quadratic on "search " * 100000).
_NOTES_WORD_RE = re.compile(r"笔记|知识库")
_SEARCH_RE = re.compile(r"\b(search|look\s+up|check)\b", re.I)
_SEARCH_AFTER_NOTES_RE = re.compile(r"\b(search|look\s+up)\b", re.I)
_NOTE_RE = re.compile(r"\bnotes?\b", re.I)


@dataclass(frozen=True)
class PromptFacts:
    """What the safeguards need to know about the user's prompt, computed once."""

    expressions: tuple[str, ...]
    computation_intent: bool
    knowledge_question: bool = False
    asks_for_notes: bool = False

    @property
    def single_expression(self) -> str | None:
        return self.expressions[0] if len(self.expressions) == 1 else None


@dataclass
class Decision:
    """What will run (``call``), what the model asked for (``original``), and why they differ."""

    call: ToolCall
    original: ToolCall | None
    applied: list[str] = field(default_factory=list)


def analyze_prompt(prompt: str) -> PromptFacts:
    expressions = tuple(find_expressions(prompt))
    return PromptFacts(expressions, bool(expressions) and _has_intent(prompt, expressions),
                       not expressions and bool(_QUESTION_RE.search(prompt)),
                       not expressions and _asks_for_notes(prompt))


def find_expressions(text: str) -> list[str]:
    """Arithmetic expressions written in ``text`` (digits and operators, ≥ one operator)."""
    found: list[str] = []
    seen: set[str] = set()
    for start, end in _candidates(text):
        if len(seen) >= MAX_CANDIDATES or len(found) >= MAX_EXPRESSIONS:
            break
        raw = text[start:end]
        if raw in seen or _glued_to_word(text, start, end):
            continue
        seen.add(raw)
        expr = _balance(raw.strip())
        if expr and expr not in found and is_arithmetic(expr):
            found.append(expr)
    return found


def _candidates(text: str):
    """Spans (start, end) of candidate expressions, in order; one linear pass."""
    for count, run in enumerate(_RUN_RE.finditer(text)):
        if count >= MAX_RUNS:
            return
        begin, stop = run.span()
        first = min((i for i in (text.find(c, begin, stop) for c in _STARTS) if i >= 0), default=stop)
        last = max(text.rfind(c, first, stop) for c in _ENDS)
        if last <= first or last - first >= MAX_CANDIDATE_CHARS:
            continue
        if any(ch in _OPERATORS for ch in text[first:last + 1]):
            yield first, last + 1


def _asks_for_notes(prompt: str) -> bool:
    return bool(_NOTES_WORD_RE.search(prompt)) or _in_order(prompt, _SEARCH_RE, _NOTE_RE) \
        or _in_order(prompt, _NOTE_RE, _SEARCH_AFTER_NOTES_RE)


def _in_order(text: str, first: re.Pattern, then: re.Pattern) -> bool:
    """``first`` then ``then`` on one line (as ``first.*then`` matches), each line searched once."""
    pos = 0
    while (found := first.search(text, pos)) is not None:
        eol = text.find("\n", found.end())
        eol = len(text) if eol < 0 else eol
        if then.search(text, found.end(), eol):
            return True
        pos = eol + 1
    return False


def guard_call(call: ToolCall, facts: PromptFacts) -> Decision:
    """Apply ``prompt_expression`` / ``reroute_to_calculator`` to one model call."""
    expr = facts.single_expression
    if expr is None:
        return Decision(call, call)
    if call.name == CALCULATOR:
        given = call.arguments.get("expression")
        if isinstance(given, str) and _same(given, expr) and set(call.arguments) == {"expression"}:
            return Decision(call, call)
        return Decision(ToolCall(CALCULATOR, {"expression": expr}), call, [PROMPT_EXPRESSION])
    if facts.computation_intent:
        return Decision(ToolCall(CALCULATOR, {"expression": expr}), call, [REROUTE])
    return Decision(call, call)


def forced_call(facts: PromptFacts) -> Decision | None:
    """A calculator call for a prompt that clearly asks to compute one expression."""
    if facts.single_expression and facts.computation_intent:
        return Decision(ToolCall(CALCULATOR, {"expression": facts.single_expression}), None, [FORCED])
    return None


def forced_retrieval(facts: PromptFacts, prompt: str, notes_match: bool) -> Decision | None:
    """A ``retrieve_note`` call for a knowledge question the notes can answer (``notes_match``:
    the retriever itself found a relevant note for the whole prompt), or for an explicit
    request to search the notes (whose empty result the model must then report)."""
    if facts.asks_for_notes or (facts.knowledge_question and notes_match):
        return Decision(ToolCall(RETRIEVE, {"query": prompt}), None, [FORCED_RETRIEVAL])
    return None


def guard_query(decision: Decision, prompt: str) -> Decision:
    """A note query sharing no word with the prompt was made up (the 0.5B model copies the
    example query from the system prompt or the tool description): search the prompt instead."""
    query = decision.call.arguments.get("query")
    if not isinstance(query, str) or set(tokenize(query)) & set(tokenize(prompt)):
        return decision
    arguments = {**decision.call.arguments, "query": prompt}
    return Decision(ToolCall(decision.call.name, arguments), decision.original,
                    [*decision.applied, QUERY_FROM_PROMPT])


def _has_intent(prompt: str, expressions: tuple[str, ...]) -> bool:
    if _INTENT_RE.search(prompt):
        return True
    rest = prompt
    for expr in expressions:
        rest = rest.replace(expr, "")
    return len(re.sub(r"\W", "", rest)) <= 3  # the prompt is (almost) just the expression


def _glued_to_word(text: str, start: int, end: int) -> bool:
    """``Qwen2.5-0.5B`` or ``v1.2-3`` are names and ``100 - 20%`` is a percentage, not plain arithmetic."""
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    return (before.isascii() and (before.isalnum() or before in "_.")) or \
        (after.isascii() and (after.isalpha() or after in "_%"))


def _balance(expr: str) -> str:
    """Drop brackets that the surrounding sentence opened or closed, e.g. ``(2+3) * 4)``."""
    expr = expr.strip()
    changed, steps = True, 0
    while expr and changed and steps < MAX_BALANCE_STEPS:
        steps += 1
        changed = False
        depth, lowest = 0, 0
        for ch in expr:
            depth += ch in _OPEN
            depth -= ch in _CLOSE
            lowest = min(lowest, depth)
        if lowest < 0 and expr[-1] in _CLOSE:
            expr, changed = expr[:-1].rstrip(), True
        elif depth > 0 and expr[0] in _OPEN:
            expr, changed = expr[1:].lstrip(), True
    return expr.rstrip("+-−*/%×÷^ ").strip() if expr and expr[-1] in "+-*/" else expr


def _same(a: str, b: str) -> bool:
    squash = lambda s: re.sub(r"\s+", "", normalize_expression(s))  # noqa: E731
    return squash(a) == squash(b)
