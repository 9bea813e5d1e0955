r"""The MATH reward: is the response's final answer the reference answer? Checked by math-verify when installed.

Two checkers, picked by ``checker``:

- ``"math-verify"`` (HuggingFace's Math-Verify, ``pip install 'rlhfctl[math]'``): parses the reference
  as ``\boxed{<ground truth>}`` with its LaTeX extractor and the whole response with its expression
  and LaTeX extractors, and scores 1 if any parsed response answer equals any parsed reference
  (symbolically, via sympy). As verl's ``verl/utils/reward_score/math_verify.py``, less its process pool:
  we call it in-process, with math-verify's own time limits (5 s a parse or a comparison) on the
  main thread (they use ``SIGALRM``; an alarm set before is re-armed after) and none on other
  threads; a time-out or an error scores 0, as there.
- ``"string-match"``: the last ``\boxed{...}`` against the reference after string normalization
  (:mod:`rlhfctl.rewards.math_string_match`), as verl's ``math_reward.py``.

``"auto"`` (the default) is math-verify when it can be imported, else the string match;
:func:`math_backend` names the one in use.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from rlhfctl.rewards.batch import as_text, check_batch
from rlhfctl.rewards.errors import RewardSettingError
from rlhfctl.rewards.math_string_match import boxed_answer, math_answers_match

__all__ = ["CHECKERS", "math", "math_backend", "math_verify_available", "score_math"]

CHECKERS = ("auto", "math-verify", "string-match")
STRING_MATCH_NAME = "normalized string match"


@functools.cache
def math_verify_available() -> bool:
    """Whether the ``math_verify`` package can be imported (checked without importing it)."""
    return importlib.util.find_spec("math_verify") is not None


def _resolve(checker: str) -> str:
    if checker not in CHECKERS:
        raise RewardSettingError(f"math: checker must be one of {', '.join(map(repr, CHECKERS))}, got {checker!r}")
    if checker == "auto":
        return "math-verify" if math_verify_available() else "string-match"
    if checker == "math-verify" and not math_verify_available():
        raise RewardSettingError(
            "math: checker 'math-verify' needs the math-verify package: pip install 'rlhfctl[math]' "
            "(or use checker: string-match)"
        )
    return checker


def math_backend(checker: str = "auto") -> str:
    """The checker ``math`` uses with this ``checker`` setting: ``"math-verify <version>"`` or ``"normalized string match"``."""
    if _resolve(checker) == "string-match":
        return STRING_MATCH_NAME
    try:
        return f"math-verify {importlib.metadata.version('math-verify')}"
    except importlib.metadata.PackageNotFoundError:  # importable but not installed as a distribution
        return "math-verify (version unknown)"


def _string_match_score(response: str, reference: str) -> float:
    answer = boxed_answer(response)
    return float(answer is not None and math_answers_match(answer, reference))


def _keeping_outer_alarm(check: Callable[[], float]) -> float:
    """Run ``check``, then re-arm an alarm set before it (pytest-timeout's, say): math-verify's limits cancel it."""
    outer, _ = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()
    try:
        return check()
    finally:
        if outer > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.001))


def _math_verify_score(response: str, reference: str) -> float:
    # math-verify's time limits are SIGALRM alarms, which only the main thread may set.
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "getitimer"):
        return _keeping_outer_alarm(lambda: _math_verify_check(response, reference, limit=5))
    return _math_verify_check(response, reference, limit=None)


def _math_verify_check(response: str, reference: str, limit: int | None) -> float:
    """verl's math_verify grading: the boxed reference against every answer parsed from the response."""
    # math_verify is optional (math_verify_available decides)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from math_verify.errors import TimeoutException  # as above

    try:
        references = parse("\\boxed{" + reference + "}", (LatexExtractionConfig(),), parsing_timeout=limit)
        answers = parse(response, (ExprExtractionConfig(), LatexExtractionConfig()), parsing_timeout=limit)
        if not references or not answers:
            return 0.0
        # Every parsed answer is verified (no stopping at the first match), so an error in any scores 0.
        return max(float(any(verify(gold, answer, timeout_seconds=limit) for gold in references)) for answer in answers)
    except (Exception, TimeoutException):  # noqa: BLE001  (model output may break the parser: a wrong answer, not a crash)
        return 0.0


_CHECKS = {"math-verify": _math_verify_score, "string-match": _string_match_score}


def score_math(response: Any, ground_truth: Any, checker: str = "auto") -> float:
    """One sample's MATH reward (1.0 right, 0.0 wrong or no answer); a None ground truth scores 0."""
    if ground_truth is None:
        return 0.0
    return _CHECKS[_resolve(checker)](as_text(response), as_text(ground_truth))


def math(prompts: list[str], responses: list[str], ground_truth: list[Any], checker: str = "auto", **columns: Any) -> list[float]:
    r"""MATH reward per sample: 1.0 when the final (``\boxed``) answer equals ``ground_truth``, else 0.0.

    ``checker``: ``"auto"`` (math-verify if installed), ``"math-verify"`` or ``"string-match"``.
    """
    check_batch(prompts, responses, ground_truth=ground_truth, **columns)
    check = _CHECKS[_resolve(checker)]
    return [0.0 if truth is None else check(as_text(response), as_text(truth)) for response, truth in zip(responses, ground_truth)]
