"""What the code-execution reward reads: the program in a response, and the tests in a row's ground truth.

Tests come in the layouts verl's and PRIME's code data use (``reward_model.ground_truth``, lifted into the
``ground_truth`` column by :mod:`rlhfctl.data.verl_layout`):

- stdin/stdout: ``{"inputs": [...], "outputs": [...]}`` (a dict, or that as a JSON string): each input is
  the program's stdin, each output what it must print (compared without trailing whitespace per line);
- call-based: the same with ``"fn_name"``: each input is the argument list of ``fn_name(*args)`` (a string
  input holds one JSON value per line, as APPS keeps them), each output the value it must return;
- assert-style: Python source (a string, or a list of strings): each top-level ``assert`` of a string is
  one case, run after the code and after the string's other statements (imports, helpers); a string with
  no top-level assert is one case that passes when it runs through; each list entry is one case.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlhfctl.rewards.code_harness import output_digest
from rlhfctl.rewards.errors import RewardSettingError

__all__ = ["TestSuite", "extract_code", "parse_tests"]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("python", "python3", "py")


@dataclass(frozen=True)
class TestSuite:
    """One row's tests: their layout (``stdio``, ``call`` or ``assert``), what goes in, what must come out."""

    kind: str
    cases: list[Any]
    """stdin texts, argument lists, or assert statements: what the sandbox gets."""
    expected: list[Any] = field(default_factory=list)
    """stdio: the digests of the expected outputs; call: the expected return values; assert: empty."""
    fn_name: str | None = None
    setup: str = ""
    """assert: the ground truth's statements other than its asserts, run before each case."""


def extract_code(response: str) -> str:
    """The program in a response: its last ```python block, else its last ``` block, else all of it; dedented
    (a block indented in a list, a response that starts with a space)."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(response)]
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    program = python[-1] if python else blocks[-1][1] if blocks else response
    return textwrap.dedent(program)


def parse_tests(ground_truth: Any, row: int) -> TestSuite:
    """The tests of row ``row``; a ground truth in none of the layouts is a :class:`RewardSettingError`."""
    try:
        return _parse(ground_truth)
    except _Malformed as problem:
        shown = repr(ground_truth)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        raise RewardSettingError(
            f"code: the ground_truth column of sample {row} (reward_model.ground_truth in verl's layout) {problem}; "
            f"it must be {{'inputs': [...], 'outputs': [...]}} (optionally with 'fn_name'), as a dict or JSON string, "
            f"or Python assert statements (a string or a list of strings); got {shown}"
        ) from None


class _Malformed(Exception):
    """Why a ground truth fits no layout (completed into one message by :func:`parse_tests`)."""


def _parse(truth: Any) -> TestSuite:
    if isinstance(truth, str) and truth.lstrip().startswith("{"):
        try:
            truth = json.loads(truth)
        except json.JSONDecodeError as error:
            raise _Malformed(f"is not valid JSON ({error})") from None
    if isinstance(truth, Mapping):
        return _input_output(truth)
    if isinstance(truth, str):
        return _asserts_of(truth)
    if isinstance(truth, (list, tuple)) and truth and all(isinstance(item, str) for item in truth):
        for position, item in enumerate(truth):
            _syntax(item, f"entry {position}")
        return TestSuite("assert", list(truth))
    raise _Malformed(f"is a {type(truth).__name__}" + (" with no tests" if isinstance(truth, (list, tuple)) else ""))


def _input_output(truth: Mapping[str, Any]) -> TestSuite:
    inputs, outputs, fn_name = truth.get("inputs"), truth.get("outputs"), truth.get("fn_name")
    if not isinstance(inputs, (list, tuple)) or not isinstance(outputs, (list, tuple)):
        raise _Malformed("has no 'inputs' and 'outputs' lists")
    if len(inputs) != len(outputs) or not inputs:
        raise _Malformed(f"has {len(inputs)} inputs and {len(outputs)} outputs (a non-empty pair of equal lengths)")
    if fn_name is not None:
        if not isinstance(fn_name, str) or not fn_name.isidentifier():
            raise _Malformed(f"has fn_name {fn_name!r}, not a Python name")
        return TestSuite("call", [_arguments(item) for item in inputs], list(outputs), fn_name)
    return TestSuite("stdio", [_text(item, "input") for item in inputs],
                     [output_digest(_text(item, "output")) for item in outputs])


def _text(value: Any, what: str) -> str:
    """A stdin or stdout text; a list of strings is its lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    raise _Malformed(f"has a stdin/stdout {what} that is a {type(value).__name__}, not text")


def _arguments(value: Any) -> list[Any]:
    """A call's arguments: a list as it is; a string holds one JSON value per line (APPS); else one argument."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        try:
            return [json.loads(line) for line in value.splitlines() if line.strip()]
        except json.JSONDecodeError:
            raise _Malformed(f"has a call input {value[:60]!r} that is not one JSON value per line") from None
    return [value]


def _asserts_of(source: str) -> TestSuite:
    if not source.strip():
        raise _Malformed("is empty")
    tree = _syntax(source, "the source")
    asserts = [node for node in tree.body if isinstance(node, ast.Assert)]
    if not asserts:
        return TestSuite("assert", [source])
    setup = [ast.get_source_segment(source, node) or "" for node in tree.body if not isinstance(node, ast.Assert)]
    return TestSuite("assert", [ast.get_source_segment(source, node) or "" for node in asserts], setup="\n".join(setup))


def _syntax(source: str, what: str) -> ast.Module:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError) as error:
        raise _Malformed(f"is Python with a syntax error in {what} ({error})") from None
