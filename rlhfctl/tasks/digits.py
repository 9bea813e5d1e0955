"""The bundled "digits" task: synthetic prompts generated at run time, and string rewards.

Prompts look like ``"digits 4 7 1:"`` with ``ground_truth`` ``"471"``. The quickstart reward,
:func:`score`, is the fraction of response characters that are decimal digits: a random policy
over the ~100-token character vocabulary scores about 0.1, and GRPO raises it within a few dozen
steps on CPU. :func:`copy_score` (partial credit for reproducing ``ground_truth``) and
:func:`exact_match_score` (GSM8K-style) are stricter rewards on the same data.

Every reward here follows the project's reward-function signature (see
:mod:`rlhfctl.tasks.reward_fn`)::

    score(prompts: list[str], responses: list[str], **columns: list[Any]) -> list[float]

called per batch with decoded prompts and responses plus each extra dataset column as a list
(here ``ground_truth``), returning one float per sample.
"""

from __future__ import annotations

import random
from typing import Any

from rlhfctl.tasks.reward_fn import check_reward_inputs

__all__ = ["copy_score", "digits_pass", "exact_match_score", "make_copy_demonstrations", "make_prompts", "score"]

_DIGITS = frozenset("0123456789")
MIN_DIGITS = 3
MAX_DIGITS = 6


def make_prompts(num: int, seed: int) -> list[dict[str, str]]:
    """``num`` records ``{"prompt": "digits 4 7 1:", "ground_truth": "471"}``, the same for a seed."""
    if num < 0:
        raise ValueError(f"num must be a non-negative number of prompts, got {num}")
    rng = random.Random(seed)
    records = []
    for _ in range(num):
        digits = [str(rng.randrange(10)) for _ in range(rng.randint(MIN_DIGITS, MAX_DIGITS))]
        records.append({"prompt": f"digits {' '.join(digits)}:", "ground_truth": "".join(digits)})
    return records


def score(prompts: list[str], responses: list[str], **columns: Any) -> list[float]:
    """Fraction of response characters that are ASCII digits (0.0 for an empty response)."""
    check_reward_inputs(prompts, responses, **columns)
    return [sum(char in _DIGITS for char in response) / len(response) if response else 0.0 for response in responses]


def digits_pass(prompts: list[str], responses: list[str], threshold: float = 0.3, **columns: Any) -> list[dict[str, float]]:
    """A verifiable 0/1 reward for DAPO-style recipes: 1 when at least ``threshold`` of the response is digits.

    Per sample it returns named scores: ``score`` and ``acc`` (the 0/1 verdict, what dynamic sampling
    compares within a group) and ``digit_fraction`` (the quickstart's graded reward, logged beside it).
    A random policy passes now and then, so groups are mixed at first; as the policy learns, whole
    groups pass and carry no group-relative signal, which is what ``algorithm.filter_groups`` drops.
    """
    fractions = score(prompts, responses, **columns)
    verdicts = [1.0 if fraction >= threshold else 0.0 for fraction in fractions]
    return [{"score": verdict, "acc": verdict, "digit_fraction": fraction} for verdict, fraction in zip(verdicts, fractions)]


def make_copy_demonstrations(num: int, seed: int) -> list[dict[str, str]]:
    """``num`` records ``{"prompt", "response", "ground_truth"}`` whose response is the prompt's digits, exactly as
    :func:`copy_score` wants them (the ``copy`` task's sft data: a teacher for distillation)."""
    return [{**record, "response": record["ground_truth"]} for record in make_prompts(num, seed)]


def copy_score(prompts: list[str], responses: list[str], ground_truth: list[Any], **columns: Any) -> list[float]:
    """Partial credit for copying: matching positions / the longer of response and ground truth.

    Extra trailing characters lower the score, so 1.0 needs the exact string; an empty response
    scores 1.0 only against an empty ground truth.
    """
    check_reward_inputs(prompts, responses, ground_truth=ground_truth, **columns)
    scores = []
    for response, truth in zip(responses, ground_truth):
        target = "" if truth is None else str(truth)
        longest = max(len(response), len(target))
        if longest == 0:
            scores.append(1.0)
            continue
        scores.append(sum(a == b for a, b in zip(response, target)) / longest)
    return scores


def exact_match_score(
    prompts: list[str], responses: list[str], ground_truth: list[Any], **columns: Any
) -> list[float]:
    """1.0 when the stripped response equals the stripped ground truth, else 0.0 (None never matches)."""
    check_reward_inputs(prompts, responses, ground_truth=ground_truth, **columns)
    return [
        1.0 if truth is not None and response.strip() == str(truth).strip() else 0.0
        for response, truth in zip(responses, ground_truth)
    ]
