"""rlhfctl.agents.tools.Calculator: arithmetic values and formatting, and every construct it refuses as text."""

from __future__ import annotations

import asyncio
import time

import pytest

from rlhfctl.agents.tool import ToolResult
from rlhfctl.agents.tools import Calculator


def calculate(expression: object, **config: object) -> ToolResult:
    return asyncio.run(Calculator(**config).execute("t", {"expression": expression}))


@pytest.mark.parametrize(
    ("expression", "shown"),
    [
        ("1 + 2", "3"),
        ("2 ** 10", "1024"),
        ("(3 + 4) * 2", "14"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("-(2) ** 2", "-4"),
        ("+5 - -5", "10"),
        ("10 / 2", "5"),
        ("0.1 + 0.2", "0.3"),
        ("1 / 3", "0.333333333333"),
        ("2 ** -2", "0.25"),
        ("2 ** 0.5", "1.41421356237"),
        ("1.5e3 * 2", "3000"),
        ("3 × 4 ÷ 5", "2.4"),
        ("10 − 4", "6"),
        ("10 ** 100", "1" + "0" * 100),
        ("  12345678901234567890 * 10  ", "123456789012345678900"),
    ],
)
def test_values_and_their_formatting(expression: str, shown: str) -> None:
    result = calculate(expression)
    assert result.text == shown
    assert result.metrics == {"ok": 1.0}


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("x + 1", "name 'x' is not allowed"),
        ("abs(-1)", "function calls are not allowed"),
        ("__import__('os').system('true')", "function calls are not allowed"),
        ("(1).real", "attribute access is not allowed"),
        ("[1, 2][0]", "subscripts are not allowed"),
        ("(lambda: 1)()", "function calls are not allowed"),
        ("lambda: 1", "lambda is not allowed"),
        ("1 < 2", "comparisons are not allowed"),
        ("1 and 2", "and/or are not allowed"),
        ("2 ^ 3", "operator ^ is not allowed (use ** for powers)"),
        ("~1", "operator ~ is not allowed"),
        ("1 << 1000", "operator << is not allowed"),
        ("'a' * 3", "str values are not allowed"),
        ("True + 1", "bool values are not allowed"),
        ("2j", "complex numbers are not allowed"),
        ("[1, 2]", "List is not allowed"),
        ("1 if 1 else 2", "IfExp is not allowed"),
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("1 +", "syntax error"),
        ("(1", "syntax error"),
        ("", "syntax error"),
        ("x = 1", "syntax error"),
        ("2 ** 101", "exponent 101 is too large (the limit is 100)"),
        ("9 ** 9 ** 9", "exponent 387420489 is too large"),
        ("10 ** 99 * 10 ** 99", "result too large"),
        ("99 ** 99", "result too large"),
        ("1" + "0" * 120, "result too large"),
        ("1e999", "result too large"),
        ("1e300 * 1e300", "result too large"),
        ("(-8) ** (1 / 3)", "complex"),
        ("-" * 5000 + "1", "expression is longer than 1000 characters"),
    ],
)
def test_refused_expressions_come_back_as_error_text(expression: str, says: str) -> None:
    result = calculate(expression)
    assert result.text.startswith("error: ")
    assert says in result.text
    assert result.metrics == {"ok": 0.0}


def test_deep_nesting_within_the_length_limit_is_an_error_not_a_crash() -> None:
    result = calculate("-" * 999 + "1")
    assert result.text.startswith("error: ") and "nested too deeply" in result.text


def test_huge_powers_are_refused_before_they_are_computed() -> None:
    started = time.monotonic()
    for expression in ("9 ** 9 ** 9", "(10 ** 100) ** 100", "2 ** 100 ** 100 ** 100", "(10**50)**3 * (10**50)**3"):
        assert calculate(expression).text.startswith("error: ")
    assert time.monotonic() - started < 1.0


def test_limits_come_from_the_config() -> None:
    assert calculate("2 ** 200", max_exponent=300, max_abs=1e50).text.startswith("error: result too large")
    assert calculate("2 ** 200", max_exponent=300, max_abs=1e61).text == str(2**200)
    assert calculate("2 ** 11", max_exponent=10).text.startswith("error: exponent 11 is too large")


def test_a_non_string_expression_is_an_error() -> None:
    assert calculate(12).text == "error: 'expression' must be a string"


def test_schema_names_the_tool_and_requires_expression() -> None:
    function = Calculator.schema["function"]
    assert Calculator.name == function["name"] == "calculator"
    assert function["parameters"]["required"] == ["expression"]
    assert function["parameters"]["properties"]["expression"]["type"] == "string"


def test_an_unknown_config_key_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(TypeError, match=r"unknown config keys \['max_exp'\].*max_exponent"):
        Calculator(max_exp=3)
