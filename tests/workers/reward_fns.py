"""Reward functions for the RewardWorker tests, imported by 'tests.workers.reward_fns:<name>'."""

from __future__ import annotations

from typing import Any

CALLS: list[dict[str, Any]] = []


def length_score(prompts: list[str], responses: list[str], **columns: Any) -> list[float]:
    """len(response), recording what it was called with."""
    CALLS.append({"prompts": list(prompts), "responses": list(responses), "columns": dict(columns)})
    return [float(len(response)) for response in responses]


def wrong_count(prompts: list[str], responses: list[str], **columns: Any) -> list[float]:
    return [1.0] * (len(responses) + 1)


def nan_at_two(prompts: list[str], responses: list[str], **columns: Any) -> list[float]:
    return [float("nan") if i == 2 else 0.5 for i in range(len(responses))]


def fails_on_second_chunk(prompts: list[str], responses: list[str], index: list[int], **columns: Any) -> list[float]:
    if 2 in index:
        raise RuntimeError("judge unavailable")
    return [1.0] * len(responses)


NOT_CALLABLE = 3
