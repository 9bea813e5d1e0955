"""The bundled "code_echo" task: write a Python program that prints a number, scored by running it.

Prompts look like ``"echo 4 7 1:"``; the ground truth holds one stdin/stdout test, ``{"inputs": [""],
"outputs": ["471"]}`` (as JSON, the layout of verl's code data), and a demonstration answers ``print(471)``.
:func:`score` is :func:`rlhfctl.rewards.code` (the program runs in the python tool's sandbox): a random
character-level policy almost never writes a program that runs, so the task is for a policy warmed up
with SFT on the demonstrations (``algorithm.name: sft``, ``data.task: code_echo``), which GRPO then sharpens.
"""

from __future__ import annotations

import json
import random
from typing import Any

__all__ = ["make_demonstrations", "make_prompts", "score"]

MIN_DIGITS = 1
MAX_DIGITS = 4


def make_prompts(num: int, seed: int) -> list[dict[str, str]]:
    """``num`` records ``{"prompt": "echo 4 7 1:", "ground_truth": '{"inputs": [""], "outputs": ["471"]}'}``."""
    if num < 0:
        raise ValueError(f"num must be a non-negative number of prompts, got {num}")
    rng = random.Random(seed)
    records = []
    for _ in range(num):
        digits = [str(rng.randrange(1, 10))]  # no leading zero: print(07) is a syntax error
        digits += [str(rng.randrange(10)) for _ in range(rng.randint(MIN_DIGITS, MAX_DIGITS) - 1)]
        records.append({"prompt": f"echo {' '.join(digits)}:",
                        "ground_truth": json.dumps({"inputs": [""], "outputs": ["".join(digits)]})})
    return records


def make_demonstrations(num: int, seed: int) -> list[dict[str, str]]:
    """``num`` records ``{"prompt": "echo 4 7 1:", "response": "print(471)"}`` for SFT on :func:`make_prompts`."""
    return [{"prompt": record["prompt"], "response": f"print({json.loads(record['ground_truth'])['outputs'][0]})"}
            for record in make_prompts(num, seed)]


def score(prompts: list[str], responses: list[str], ground_truth: list[Any], **columns: Any) -> list[dict[str, float]]:
    """:func:`rlhfctl.rewards.code` on the task's tests (imported here: the rewards package imports this one's)."""
    from rlhfctl.rewards.code_execution import code

    return code(prompts, responses, ground_truth, **columns)


score.known_function_kwargs = frozenset(("timeout_s", "memory_mib", "max_parallel", "allow_unconfined"))  # type: ignore[attr-defined]
