"""The bundled ``calculator`` tool: arithmetic on numbers, parsed with :mod:`ast`, never evaluated as Python.

Only number literals, ``+ - * / // % **``, unary ``+``/``-`` and parentheses are accepted; names, calls,
attributes, subscripts, comparisons and everything else are rejected by node type. Every intermediate
value is bounded by ``max_abs``, and a power is checked before it is computed, so no expression the
model writes can take more than microseconds or more than a few hundred bytes.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from rlhfctl.agents.tool import Tool, ToolResult

__all__ = ["Calculator", "CalculatorError", "evaluate", "format_number"]

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_SPELLINGS = {"×": "*", "÷": "/", "−": "-"}  # the multiplication, division and minus signs
_ALLOWED = "only numbers, + - * / // % **, unary + -, and parentheses are allowed"
_REJECTED: dict[type[ast.AST], str] = {
    ast.Call: "function calls are not allowed",
    ast.Attribute: "attribute access is not allowed",
    ast.Subscript: "subscripts are not allowed",
    ast.Lambda: "lambda is not allowed",
    ast.Compare: "comparisons are not allowed",
    ast.BoolOp: "and/or are not allowed",
}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot compute; the message says what was wrong."""


def evaluate(expression: str, *, max_exponent: int, max_abs: float) -> Number:
    """The value of an arithmetic ``expression``; raises :class:`CalculatorError` for anything else."""
    for sign, ascii_sign in _SPELLINGS.items():
        expression = expression.replace(sign, ascii_sign)
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        where = f" at column {error.offset}" if error.offset else ""
        raise CalculatorError(f"syntax error: {error.msg}{where}") from None
    except (RecursionError, MemoryError, ValueError):
        raise CalculatorError("expression is nested too deeply or is malformed") from None
    try:
        return _Evaluator(max_exponent, max_abs).visit(tree.body)
    except RecursionError:
        raise CalculatorError("expression is nested too deeply") from None


def format_number(value: Number) -> str:
    """An int as all its digits; a float with up to 12 significant digits (``0.1 + 0.2`` is ``0.3``)."""
    if isinstance(value, int):
        return str(value)
    return format(value, ".12g")


class _Evaluator:
    """Walks an expression tree, computing each node and checking each value against the bounds."""

    def __init__(self, max_exponent: int, max_abs: float) -> None:
        self.max_exponent = max_exponent
        self.max_abs = max_abs

    def visit(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Constant):
            return self._bounded(self._literal(node.value))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return self._bounded(_UNARY[type(node.op)](self.visit(node.operand)))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self._binary(node)
        raise CalculatorError(_rejection(node))

    def _binary(self, node: ast.BinOp) -> Number:
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.Pow):
            self._check_power(left, right)
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError(f"result too large (the limit is {self.max_abs:g} in absolute value)") from None
        if isinstance(value, complex):
            raise CalculatorError("result is a complex number (a negative base to a fractional power)")
        return self._bounded(value)

    def _check_power(self, base: Number, exponent: Number) -> None:
        if abs(exponent) > self.max_exponent:
            raise CalculatorError(f"exponent {format_number(exponent)} is too large (the limit is {self.max_exponent})")
        if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(self.max_abs) + 1:
            raise CalculatorError(f"result too large (the limit is {self.max_abs:g} in absolute value)")

    def _literal(self, value: object) -> Number:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = "complex numbers are" if isinstance(value, complex) else f"{type(value).__name__} values are"
            raise CalculatorError(f"{kind} not allowed; {_ALLOWED}")
        return value

    def _bounded(self, value: Number) -> Number:
        if math.isnan(value):
            raise CalculatorError("result is not a number")
        if abs(value) > self.max_abs:
            raise CalculatorError(f"result too large (the limit is {self.max_abs:g} in absolute value)")
        return value


def _rejection(node: ast.AST) -> str:
    """Why ``node`` is refused, in words the model can act on."""
    if isinstance(node, ast.Name):
        return f"name {node.id!r} is not allowed; {_ALLOWED}"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        symbol = {ast.BitXor: "^", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>",
                  ast.Invert: "~", ast.Not: "not", ast.MatMult: "@"}.get(type(node.op), type(node.op).__name__)
        hint = " (use ** for powers)" if symbol == "^" else ""
        return f"operator {symbol} is not allowed{hint}; {_ALLOWED}"
    reason = _REJECTED.get(type(node), f"{type(node).__name__} is not allowed")
    return f"{reason}; {_ALLOWED}"


class Calculator(Tool):
    """Evaluates one arithmetic expression; bad input comes back as ``error: ...`` text, never an exception.

    Config (defaults in :attr:`defaults`): ``max_exponent``, the largest ``|exponent|`` of a power;
    ``max_abs``, the largest absolute value of any intermediate result; ``max_length``, the longest
    expression in characters.
    """

    name: ClassVar[str] = "calculator"
    schema: ClassVar[Mapping[str, Any]] = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "For example: (3 + 4) * 2 ** 10 / 7"},
                },
                "required": ["expression"],
            },
        },
    }

    defaults: ClassVar[Mapping[str, Any]] = {"max_exponent": 100, "max_abs": 1e100, "max_length": 1000}

    def __init__(self, **config: Any) -> None:
        unknown = sorted(set(config) - set(self.defaults))
        if unknown:
            raise TypeError(f"calculator tool: unknown config keys {unknown}; the known keys are {sorted(self.defaults)}")
        super().__init__(**config)
        settings = {**self.defaults, **config}
        self.max_exponent = int(settings["max_exponent"])
        self.max_abs = float(settings["max_abs"])
        self.max_length = int(settings["max_length"])

    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        """The expression's value as text, or ``error: <what was wrong>``."""
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            return _failure("'expression' must be a string")
        if len(expression) > self.max_length:
            return _failure(f"expression is longer than {self.max_length} characters")
        try:
            value = evaluate(expression, max_exponent=self.max_exponent, max_abs=self.max_abs)
        except CalculatorError as error:
            return _failure(str(error))
        return ToolResult(format_number(value), metrics={"ok": 1.0})


def _failure(message: str) -> ToolResult:
    return ToolResult(f"error: {message}", metrics={"ok": 0.0})
