"""GSM8K's reward: the final number of a response, compared as text with the reference answer.

Behaves as verl's ``verl/utils/reward_score/gsm8k.py`` (Trung et al., "ReFT: Reasoning with
Reinforced Fine-Tuning", ACL 2024, scoring), case for case; ``tests/rewards`` holds verl's scores for
a table of tricky and random cases and checks ours against them:

- only the last ``TAIL_CHARS`` (300) characters are read: final answers come at the end, and a regex
  over a long response is slow;
- ``strict``: the last ``"#### <number>"`` (one space after the four hashes), commas removed;
  without one the response has no answer (0);
- ``flexible``: the last run of digits, dots and commas (with an optional leading ``-``) that is not a
  lone ``"."``; commas are kept, so ``"1,234"`` does not match ``"1234"``;
- reward = ``score`` if the answer equals the ground truth as text, ``format_score`` if there is an
  answer but it is wrong, 0 without an answer.
"""

from __future__ import annotations

import re
from typing import Any

from rlhfctl.rewards.batch import as_text, check_batch
from rlhfctl.rewards.errors import RewardSettingError

__all__ = ["METHODS", "TAIL_CHARS", "extract_gsm8k_answer", "gsm8k", "score_gsm8k"]

TAIL_CHARS = 300
METHODS = ("strict", "flexible")
_AFTER_HASHES = re.compile(r"#### (-?[0-9.,]+)")
_NUMBER_LIKE = re.compile(r"-?[0-9.,]+")


def extract_gsm8k_answer(response: str, method: str = "strict") -> str | None:
    """The answer a GSM8K response gives (see the module docstring), or None when it gives none."""
    tail = response[-TAIL_CHARS:]
    if method == "strict":
        found = _AFTER_HASHES.findall(tail)
        return found[-1].replace(",", "") if found else None
    found = _NUMBER_LIKE.findall(tail)
    if not found:
        return None
    numbers = [text for text in found if text != "."]
    # Only lone dots: verl's scan ends on one of them, which then scores as a wrong answer.
    return numbers[-1] if numbers else "."


def score_gsm8k(response: Any, ground_truth: Any, method: str = "strict", format_score: float = 0.0, score: float = 1.0) -> float:
    """One sample's GSM8K reward; a None ground truth scores 0, any other is compared as ``str(ground_truth)``."""
    if ground_truth is None:
        return 0.0
    answer = extract_gsm8k_answer(as_text(response), method)
    if answer is None:
        return 0.0
    return score if answer == as_text(ground_truth) else format_score


def gsm8k(
    prompts: list[str],
    responses: list[str],
    ground_truth: list[Any],
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
    **columns: Any,
) -> list[float]:
    """GSM8K reward per sample: ``score`` for the right final number, ``format_score`` for a wrong one, else 0.

    ``method`` is ``"strict"`` (the number after ``"#### "``) or ``"flexible"`` (the last number).
    """
    check_batch(prompts, responses, ground_truth=ground_truth, **columns)
    if method not in METHODS:
        raise RewardSettingError(f"gsm8k: method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    try:
        format_score, score = float(format_score), float(score)
    except (TypeError, ValueError):
        raise RewardSettingError(
            f"gsm8k: score and format_score must be numbers, got score={score!r}, format_score={format_score!r}"
        ) from None
    return [score_gsm8k(response, truth, method, format_score, score) for response, truth in zip(responses, ground_truth)]
