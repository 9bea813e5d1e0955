"""The rules of the guess-the-digit environment the tests serve over OpenEnv, light enough for a reward worker.

The secret is a digit (the first of the sample's ``ground_truth`` when the recipe passes it to ``reset``, else 7).
A turn whose text contains it is correct: reward 1, the episode ends; any other turn earns 0.25 and the feedback
:data:`WRONG`.
"""

from __future__ import annotations

from typing import Any

CORRECT = "correct"
WRONG = "wrong, try again"
DEFAULT_SECRET = "7"


def secret_of(ground_truth: Any = None) -> str:
    """The secret digit of an episode: the first character of ``ground_truth``, else :data:`DEFAULT_SECRET`."""
    text = str(ground_truth or "")
    return text[0] if text else DEFAULT_SECRET


def guess_step(text: str, secret: str) -> tuple[str, float, bool]:
    """``(feedback, reward, done)`` for one guess."""
    if secret in text:
        return CORRECT, 1.0, True
    return WRONG, 0.25, False


def score(prompts: list[str], responses: list[str], **columns: Any) -> list[float]:
    """The reward function of the environment runs: the sum of the rewards the environment gave each trajectory
    (``tool_rewards``, taken through ``**columns``: validate's signature check reads only the data's columns)."""
    return [float(value) for value in columns["tool_rewards"]]
