"""A weighted mixture of tasks (``data.tasks``): each task's share of the prompts follows its weight.

The counts are exact (largest remainder: 2:1 of 300 prompts is 200 and 100) and each task generates its
share with the run's seed, as it would alone; a seeded shuffle then interleaves them, so a mixture is
the same for a seed and a batch holds every task in about its share.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["apportion", "interleave"]

Generator = Callable[[int, int], list[dict[str, Any]]]
"""``generate(num, seed)`` -> records: a task's make_prompts or make_demonstrations."""


def apportion(num: int, weights: Sequence[float]) -> list[int]:
    """Counts per weight that sum to ``num``, in proportion (largest remainder; a tie goes to the earlier weight)."""
    if num < 0:
        raise ValueError(f"num must be a non-negative number of records, got {num}")
    if not weights or any(not math.isfinite(weight) or weight <= 0 for weight in weights):
        raise ValueError(f"weights must be positive numbers, got {list(weights)}")
    total = float(sum(weights))
    exact = [num * weight / total for weight in weights]
    counts = [math.floor(share) for share in exact]
    by_remainder = sorted(range(len(weights)), key=lambda index: (-(exact[index] - counts[index]), index))
    for index in by_remainder[: num - sum(counts)]:
        counts[index] += 1
    return counts


def interleave(generators: Sequence[Generator], weights: Sequence[float], num: int, seed: int) -> list[dict[str, Any]]:
    """``num`` records: each generator's share (:func:`apportion`) made with ``seed``, shuffled together by ``seed``."""
    counts = apportion(num, weights)
    parts = [iter(generate(count, seed)) for generate, count in zip(generators, counts)]
    order = [index for index, count in enumerate(counts) for _ in range(count)]
    random.Random(f"{seed}:mixture").shuffle(order)
    return [next(parts[index]) for index in order]
