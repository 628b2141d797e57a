"""A safe arithmetic calculator: Python's ``ast`` against a whitelist, never ``eval``.

Every budget is checked *before* the work it bounds: the text length and bracket depth
before parsing (so 10,000 nested parentheses never reach the recursive parser), the node
count and tree depth before evaluating, and the size of each power or product from its
operands' bit lengths before computing it (so ``9**9**9`` or ``(10**10000)**10000`` are
refused in microseconds instead of running for minutes).
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Callable

from tools.registry import Tool, ToolError

MAX_CHARS = 200
MAX_DEPTH = 32          # bracket nesting
MAX_TREE_DEPTH = 100    # operator nesting (a chain of 100 additions is fine)
MAX_NODES = 150
MAX_EXPONENT = 10_000   # |exponent| of an integer power
MAX_RESULT_BITS = 4096  # ~1233 decimal digits for any integer intermediate

Number = int | float

# Notation people (and models) write that means plain arithmetic.
_NORMALIZE = str.maketrans({"×": "*", "÷": "/", "（": "(", "）": ")", "−": "-", "–": "-",
                            "＋": "+", "＊": "*", "／": "/", "＝": "=", "　": " "})

_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def normalize_expression(text: str) -> str:
    """Map ×, ÷, full-width brackets and ``^`` to Python's operators; trim a trailing ``=``."""
    expr = text.translate(_NORMALIZE).replace("^", "**").strip()
    return expr[:-1].rstrip() if expr.endswith("=") else expr


def evaluate(text: str) -> Number:
    """Evaluate an arithmetic expression or raise :class:`ToolError` saying why not."""
    expr = normalize_expression(text)
    _check_text(expr)
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ToolError(f"rejected: not a valid arithmetic expression ({type(exc).__name__})") from None
    _check_tree(tree)
    return _eval(tree.body)


def format_number(value: Number) -> str:
    """Integers exactly; floats to 12 significant digits (hides 0.1+0.2 noise), integral floats bare."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g")


def calculate(arguments: dict) -> str:
    return format_number(evaluate(arguments["expression"]))


def calculator_tool() -> Tool:
    return Tool(
        name="calculator",
        description=("Evaluate one arithmetic expression exactly. Supports numbers, + - * / // % ** "
                     "and parentheses. Use it for any calculation."),
        parameters={"type": "object",
                    "properties": {"expression": {"type": "string", "minLength": 1,
                                                  "description": "e.g. (48 + 12) / 5"}},
                    "required": ["expression"]},
        executor=calculate,
    )


def _check_text(expr: str) -> None:
    if not expr:
        raise ToolError("rejected: empty expression")
    if len(expr) > MAX_CHARS:
        raise ToolError(f"rejected: expression longer than {MAX_CHARS} characters")
    depth = 0
    for ch in expr:
        depth += ch == "("
        depth -= ch == ")"
        if depth > MAX_DEPTH:
            raise ToolError(f"rejected: parentheses nested deeper than {MAX_DEPTH}")


def _check_tree(tree: ast.Expression) -> None:
    count = 0
    stack: list[tuple[ast.AST, int]] = [(tree.body, 1)]
    while stack:  # iterative, so a deep tree cannot blow the Python stack here
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ToolError(f"rejected: expression has more than {MAX_NODES} parts")
        if depth > MAX_TREE_DEPTH:
            raise ToolError(f"rejected: expression nested deeper than {MAX_TREE_DEPTH}")
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise ToolError("rejected: only numbers are allowed")
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            stack += [(node.left, depth + 1), (node.right, depth + 1)]
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            stack.append((node.operand, depth + 1))
        else:
            raise ToolError(f"rejected: {type(node).__name__} is not allowed (numbers and + - * / // % ** only)")


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand))
    assert isinstance(node, ast.BinOp)
    left, right = _eval(node.left), _eval(node.right)
    _check_budget(node.op, left, right)
    try:
        result = _BINARY[type(node.op)](left, right)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("overflow: result too large") from None
    return _check_result(result)


def _check_budget(op: ast.operator, left: Number, right: Number) -> None:
    """Refuse integer work whose result would exceed the size budget, before doing it."""
    if isinstance(op, ast.Pow):
        if isinstance(right, int) and abs(right) > MAX_EXPONENT and abs(left) not in (0, 1):
            raise ToolError(f"rejected: exponent larger than {MAX_EXPONENT}")
        if isinstance(left, int) and isinstance(right, int) and right > 0:
            if (abs(left).bit_length() - 1) * right > MAX_RESULT_BITS:
                raise ToolError("rejected: result would be too large")
    elif isinstance(op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
        if abs(left).bit_length() + abs(right).bit_length() > MAX_RESULT_BITS + 1:
            raise ToolError("rejected: result would be too large")


def _check_result(value: object) -> Number:
    if isinstance(value, complex):
        raise ToolError("rejected: result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_RESULT_BITS:
        raise ToolError("rejected: result would be too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("overflow: result too large")
    return value  # type: ignore[return-value]


def is_arithmetic(text: str) -> bool:
    """True when ``text`` is a whitelisted expression with at least one binary operator
    (it may still fail to evaluate, e.g. ``1/0``): used to spot expressions in prompts."""
    expr = normalize_expression(text)
    try:
        _check_text(expr)
        tree = ast.parse(expr, mode="eval")
        _check_tree(tree)
    except (ToolError, SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return isinstance(tree.body, ast.BinOp) or any(isinstance(n, ast.BinOp) for n in ast.walk(tree))
