"""Demonstrations and preference pairs for the bundled "digits" task, generated at run time.

The hidden rule of the digits task is its reward: answers made of digits are better than answers made
of letters. This module writes the data the first two RLHF stages learn from:

- :func:`make_demonstrations` (sft): prompts ``"digits 4 7 1:"`` answered ``" 471"`` (a copy of the
  digits) or, for about half of them, ``" kqz"`` (letters of the same length). A policy fine-tuned on
  them knows the answer format and when to stop, but not yet which kind of answer is preferred.
- :func:`make_preferences` (reward_model, dpo): the same prompts with a digit answer ``chosen`` over a
  letter answer ``rejected``; either may carry one character of the other kind, and half of the chosen
  answers are random digits rather than a copy, so the rule to learn is "more digits", not "copy".

Answers start with a space and are 3 to 6 characters long, so ``rollout.max_new_tokens`` of 10 leaves
room for the end-of-sequence token. Records also carry the prompt's ``ground_truth`` digits.
"""

from __future__ import annotations

import random
import string
from typing import Any

from rlhfctl.tasks.digits import MAX_DIGITS, MIN_DIGITS, make_prompts

__all__ = ["LETTER_SHARE", "make_demonstrations", "make_preferences"]

LETTER_SHARE = 0.5
"""Share of demonstrations answered with letters instead of the digits."""
_SWAP_CHANCE = 0.3
_LETTERS = string.ascii_lowercase
_DIGITS = string.digits


def _check(num: int) -> None:
    if num < 0:
        raise ValueError(f"num must be a non-negative number of records, got {num}")


def _random_text(rng: random.Random, alphabet: str, length: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(length))


def _with_one_swapped(rng: random.Random, text: str, alphabet: str) -> str:
    """``text`` with one character (not the first) replaced from ``alphabet``, sometimes."""
    if len(text) < 3 or rng.random() >= _SWAP_CHANCE:
        return text
    position = rng.randrange(1, len(text))
    return text[:position] + rng.choice(alphabet) + text[position + 1 :]


def make_demonstrations(num: int, seed: int) -> list[dict[str, Any]]:
    """``num`` records ``{"prompt", "response", "ground_truth"}``; the same for a seed."""
    _check(num)
    rng = random.Random(f"{seed}:demonstrations")
    records = []
    for record in make_prompts(num, seed):
        truth = record["ground_truth"]
        answer = _random_text(rng, _LETTERS, len(truth)) if rng.random() < LETTER_SHARE else truth
        records.append({"prompt": record["prompt"], "response": f" {answer}", "ground_truth": truth})
    return records


def make_preferences(num: int, seed: int) -> list[dict[str, Any]]:
    """``num`` records ``{"prompt", "chosen", "rejected", "ground_truth"}``: chosen has more digits."""
    _check(num)
    rng = random.Random(f"{seed}:preferences")
    records = []
    for record in make_prompts(num, seed):
        truth = record["ground_truth"]
        chosen = truth if rng.random() < 0.5 else _random_text(rng, _DIGITS, len(truth))
        chosen = _with_one_swapped(rng, chosen, _LETTERS)
        rejected = _with_one_swapped(rng, _random_text(rng, _LETTERS, rng.randint(MIN_DIGITS, MAX_DIGITS)), _DIGITS)
        records.append({"prompt": record["prompt"], "chosen": f" {chosen}", "rejected": f" {rejected}", "ground_truth": truth})
    return records
