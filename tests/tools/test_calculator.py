
import pytest

from tests.harness.bounded import returns
from tools import calculator, create_default_registry
from tools.calculator import evaluate, format_number
from tools.registry import ToolError


@pytest.mark.parametrize("expr, expected", [
    ("(48 + 12) / 5", "12"),
    ("48 + 12 / 5", "50.4"),
    ("(125 * 8) - 37", "963"),
    ("2 ** 10", "1024"),
    ("7 // 2", "3"),
    ("-7 % 3", "2"),
    ("-(3 - 5)", "2"),
    ("+4", "4"),
    ("0.1 + 0.2", "0.3"),
    ("1.5e3 * 2", "3000"),
    ("3 × 4 ÷ 2", "6"),
    ("（1 + 2）* 3", "9"),
    ("2^8", "256"),
    ("6 * 7 =", "42"),
    ("2 ** -2", "0.25"),
    ("1" + "+1" * 70, "71"),
])
def test_whitelisted_arithmetic(expr, expected):
    assert format_number(evaluate(expr)) == expected


@pytest.mark.parametrize("expr", [
    "__import__('os').system('echo hi')",
    "abs(-1)",
    "x + 1",
    "(1).real",
    "[1, 2]",
    "1 if 1 else 2",
    "1 < 2",
    "1 & 3",
    "~1",
    "'a' * 3",
    "True + 1",
    "lambda: 1",
    "1; 2",
    "",
    "   ",
])
def test_everything_else_is_rejected(expr):
    with pytest.raises(ToolError):
        evaluate(expr)


def _rejected_quickly(expr: str) -> str:
    """The guard trips before the work, not after: no operation the evaluation ran produced
    an integer past the result budget (each one is recorded), and it returned (30 s net)."""
    largest = [0]

    def recording(op):
        def run(a, b):
            value = op(a, b)
            if isinstance(value, int):
                largest[0] = max(largest[0], value.bit_length())
            return value
        return run

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calculator, "_BINARY", {node: recording(op) for node, op in calculator._BINARY.items()})
        with pytest.raises(ToolError) as info:
            returns(lambda: evaluate(expr))
    assert largest[0] <= calculator.MAX_RESULT_BITS, "a guard tripped only after the work"
    return str(info.value)


@pytest.mark.parametrize("expr, reason", [
    ("9**9**9", "exponent"),
    ("9**9**9**9", "exponent"),
    ("2**10**8", "exponent"),
    ("(10**10000)**10000", "too large"),
    ("10**5000", "too large"),
    ("(2**4000)*(2**4000)", "too large"),
    ("*".join(["10**1000"] * 5), "too large"),
    ("(" * 10_000 + "1" + ")" * 10_000, "longer than"),
    ("(" * 40 + "1" + ")" * 40, "nested deeper"),
    ("-" * 150 + "1", "nested deeper"),
    ("1" + "+1" * 150, "longer than"),
    ("1+" * 99 + "1" , "parts"),
])
def test_budget_guards_reject_before_computing(expr, reason):
    assert reason in _rejected_quickly(expr)


def test_huge_parenthesis_nesting_does_not_recurse():
    _rejected_quickly("(" * 100_000 + ")" * 100_000)


@pytest.mark.parametrize("expr, fragment", [
    ("1 / 0", "division by zero"),
    ("5 // 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("1e308 * 10", "overflow"),
    ("2.0 ** 5000", "overflow"),
    ("(-8) ** 0.5", "not a real number"),
])
def test_math_errors_are_tool_errors(expr, fragment):
    assert fragment in _rejected_quickly(expr)


def test_registry_reports_calculator_errors():
    registry = create_default_registry()
    assert registry.execute("calculator", {"expression": "(125 * 8) - 37"}).content == "963"
    failed = registry.execute("calculator", {"expression": "1/0"})
    assert not failed.success and failed.error == "division by zero"
    assert not registry.execute("calculator", {"expr": "1"}).success
