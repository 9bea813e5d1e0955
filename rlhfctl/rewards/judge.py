"""An LLM judge as the reward (``roles.reward.judge``): the judge's prompt, and its verdict read as a score.

The reward worker renders one prompt per sample from ``judge.template`` (:func:`render_prompt`), the judge model
writes a verdict, and :func:`parse_verdicts` turns the verdicts into scores with ``judge.parser``: a bundled
parser (:data:`BUNDLED_PARSERS`) or the user's ``verdict -> float | None``. A verdict that does not parse scores
``judge.parse_error_score`` and is counted; every score is clipped to ``judge.score_range``.

Pure Python: no torch, transformers or ray (``rlhfctl validate`` renders and checks with it).
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfctl.rewards.errors import RewardSettingError

__all__ = [
    "BUNDLED_PARSERS",
    "DEFAULT_TEMPLATE",
    "JudgeScores",
    "PLACEHOLDERS",
    "load_parser",
    "parse_error_score_problem",
    "parse_verdicts",
    "render_prompt",
    "score_range_problem",
    "template_problem",
    "template_of",
]

PLACEHOLDERS = ("prompt", "response", "reference", "rubric")
"""The names a judge template may use: the sample's prompt and response, its ``ground_truth`` and ``judge.rubric``."""

DEFAULT_TEMPLATE = (
    "You are a careful and strict judge. Read the task, the reference answer (when one is given) and the response, "
    "then grade the response.\n\n"
    "Rubric: {rubric}\n\n"
    "Task:\n{prompt}\n\n"
    "Reference answer:\n{reference}\n\n"
    "Response:\n{response}\n\n"
    "Explain your grade in one or two sentences, then end with a line of the form \"Score: <number>\"."
)
"""The bundled judge template (``judge.template: null``), written for the bundled ``score`` parser."""

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_SCORE_MARK = re.compile(r"score\s*[:=]", re.IGNORECASE)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)

Parser = Callable[[str], Any]


def template_of(template: str | None) -> str:
    """The template a judge uses: ``judge.template``, else :data:`DEFAULT_TEMPLATE`."""
    return DEFAULT_TEMPLATE if template is None else str(template)


def template_problem(template: str | None) -> str | None:
    """Why ``template`` cannot render (an unknown or positional placeholder, an unmatched brace), or None."""
    try:
        fields = [name for _, name, spec, conversion in string.Formatter().parse(template_of(template)) if name is not None]
    except ValueError as failure:
        return f"{failure} (write a literal brace as {{{{ or }}}})"
    for name in fields:
        if name not in PLACEHOLDERS:
            shown = "{" + name + "}" if name else "{}"
            return (f"unknown placeholder {shown}; a judge template may use {', '.join('{' + p + '}' for p in PLACEHOLDERS)} "
                    "(write a literal brace as {{ or }})")
    return None


def render_prompt(template: str | None, *, prompt: str, response: str, reference: str = "", rubric: str = "") -> str:
    """One judge prompt: ``template`` (null: the bundled one) with the sample's texts in its placeholders."""
    return template_of(template).format(prompt=prompt, response=response, reference=reference, rubric=rubric)


def score_range_problem(score_range: Sequence[Any]) -> str | None:
    """Why ``judge.score_range`` is no score range (not two finite numbers, min below max), or None."""
    values = list(score_range)
    if len(values) != 2 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        return f"must be two finite numbers [min, max], got {values}"
    if float(values[0]) >= float(values[1]):
        return f"must be [min, max] with min < max, got [{values[0]}, {values[1]}]"
    return None


def parse_error_score_problem(score_range: Sequence[float], parse_error_score: float) -> str | None:
    """Why ``judge.parse_error_score`` cannot be the score of an unreadable verdict (outside the range), or None."""
    low, high = (float(value) for value in score_range)
    if not low <= float(parse_error_score) <= high:
        return f"{parse_error_score} is outside score_range [{score_range[0]}, {score_range[1]}]; pick a score within it"
    return None


def score_parser(low: float, high: float) -> Parser:
    """The bundled ``score`` parser for ``[low, high]``: after the last "Score:" the first number in the range,
    else the last number in the range anywhere in the verdict; None when there is none."""

    def parse(verdict: str) -> float | None:
        marks = list(_SCORE_MARK.finditer(verdict))
        if marks:
            after = [float(n) for n in _NUMBER.findall(verdict[marks[-1].end():])]
            chosen = next((n for n in after if low <= n <= high), None)
            if chosen is not None:
                return chosen
        numbers = [float(n) for n in _NUMBER.findall(verdict) if low <= float(n) <= high]
        return numbers[-1] if numbers else None

    return parse


def yes_no_parser(low: float, high: float) -> Parser:
    """The bundled ``yes_no`` parser: the verdict's first word yes (``high``) or no (``low``); None without either."""

    def parse(verdict: str) -> float | None:
        found = _YES_NO.search(verdict)
        if found is None:
            return None
        return high if found.group(1).lower() == "yes" else low

    return parse


BUNDLED_PARSERS: dict[str, Callable[[float, float], Parser]] = {"score": score_parser, "yes_no": yes_no_parser}
"""``judge.parser`` names, each a factory taking ``score_range`` and returning ``verdict -> float | None``."""


def load_parser(spec: str, score_range: Sequence[float], key_path: str = "roles.reward.judge.parser") -> Parser:
    """The parser ``judge.parser`` names: a bundled one (built for ``score_range``), or the user's
    ``module:function`` / ``path/to/file.py:function``; RewardSettingError naming ``key_path`` otherwise."""
    name = str(spec).strip()
    if name in BUNDLED_PARSERS:
        low, high = (float(value) for value in score_range)
        return BUNDLED_PARSERS[name](low, high)
    if ":" not in name:
        raise RewardSettingError(
            f"{key_path}: {spec!r} is neither a bundled parser ({', '.join(BUNDLED_PARSERS)}) nor "
            "'package.module:function' / 'path/to/file.py:function'")
    target, _, attribute = name.rpartition(":")
    if not target or not attribute.isidentifier():
        raise RewardSettingError(f"{key_path}: {spec!r} is malformed: expected 'package.module:function' or 'path/to/file.py:function'")
    module = _import(target, spec, key_path)
    function = getattr(module, attribute, None)
    if function is None or not callable(function):
        what = "has no attribute" if function is None else "has a non-callable"
        raise RewardSettingError(f"{key_path}: cannot load {spec!r}: {target!r} {what} {attribute!r}")
    return function


def _import(target: str, spec: str, key_path: str) -> Any:
    """The module a user parser lives in (a dotted module, or a .py file relative to the working directory)."""
    import importlib

    from rlhfctl.recipe.importing import ensure_cwd_importable, import_python_file

    try:
        if target.endswith(".py"):
            return import_python_file(Path(target).expanduser(), prefix="rlhfctl_judge_parser")
        ensure_cwd_importable()
        return importlib.import_module(target)
    except (Exception, SystemExit) as failure:  # user code may fail in any way at import time
        detail = str(failure).splitlines()[0] if str(failure) else ""
        reason = f"{type(failure).__name__}: {detail}" if detail else type(failure).__name__
        raise RewardSettingError(f"{key_path}: cannot load {spec!r}: {reason}") from None


@dataclass(frozen=True)
class JudgeScores:
    """What the verdicts of one batch scored: ``scores`` (clipped), the ``verdicts`` and which failed to parse."""

    scores: list[float]
    verdicts: list[str]
    parse_errors: list[bool]

    @property
    def parse_error_count(self) -> int:
        """How many verdicts did not parse (each scored ``parse_error_score``)."""
        return sum(self.parse_errors)


def parse_verdicts(verdicts: Sequence[str], parser: Parser, score_range: Sequence[float],
                   parse_error_score: float, parser_name: str = "judge parser") -> JudgeScores:
    """Each verdict's score: the parser's number clipped to ``score_range``, or ``parse_error_score`` where it returns
    None (or no finite number); a parser that raises stops the scoring with a message naming it."""
    low, high = (float(value) for value in score_range)
    scores, failed = [], []
    for verdict in verdicts:
        try:
            value = parser(str(verdict))
        except Exception as failure:
            raise RewardSettingError(
                f"roles.reward.judge.parser {parser_name!r} raised {type(failure).__name__}: {failure} on the verdict "
                f"{str(verdict)[:200]!r}; return None for a verdict it cannot read") from failure
        number = _as_number(value)
        failed.append(number is None)
        scores.append(float(parse_error_score) if number is None else min(max(number, low), high))
    return JudgeScores(scores, [str(verdict) for verdict in verdicts], failed)


def _as_number(value: Any) -> float | None:
    """A parser's result as a finite float; None for None, a non-number or a NaN/inf."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
