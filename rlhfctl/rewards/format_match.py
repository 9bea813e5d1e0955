"""A format reward: ``score`` when the response matches a regular expression, else 0.

The pattern is compiled once (and cached across batches) with ``re.DOTALL``, so ``.`` crosses
newlines, as a multi-line response needs. ``mode="search"`` rewards a match anywhere in the
response (``re.search``); ``mode="fullmatch"`` only a match of the whole response (``re.fullmatch``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from rlhfctl.rewards.batch import as_text, check_batch
from rlhfctl.rewards.errors import RewardSettingError

__all__ = ["MODES", "compile_format_pattern", "format"]

MODES = ("search", "fullmatch")


def compile_format_pattern(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled with ``re.DOTALL``; a bad one raises :class:`RewardSettingError` naming it and the regex error."""
    if not isinstance(pattern, str):
        raise RewardSettingError(f"format: pattern must be a regular expression string, got {type(pattern).__name__} {pattern!r}")
    return _compile(pattern)


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error as error:
        raise RewardSettingError(f"format: pattern {pattern!r} is not a valid regular expression: {error}") from None


def format(prompts: list[str], responses: list[str], pattern: str, score: float = 1.0, mode: str = "search", **columns: Any) -> list[float]:
    """``score`` for each response that matches ``pattern`` (``mode``: ``"search"`` anywhere, ``"fullmatch"`` whole), else 0.0."""
    check_batch(prompts, responses, **columns)
    if mode not in MODES:
        raise RewardSettingError(f"format: mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    try:
        score = float(score)
    except (TypeError, ValueError):
        raise RewardSettingError(f"format: score must be a number, got {score!r}") from None
    compiled = compile_format_pattern(pattern)
    matches = compiled.search if mode == "search" else compiled.fullmatch
    return [score if matches(as_text(response)) else 0.0 for response in responses]
