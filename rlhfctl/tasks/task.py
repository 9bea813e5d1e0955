"""What a task is: a prompt generator paired with the reward that scores its responses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlhfctl.errors import UserError
from rlhfctl.tasks.reward_fn import RewardFn

__all__ = ["Task", "UnknownTaskError"]


@dataclass(frozen=True)
class Task:
    """A prompt generator paired with the reward that scores its responses."""

    name: str
    make_prompts: Callable[[int, int], list[dict[str, Any]]]
    """``make_prompts(num, seed)`` -> records with a ``prompt`` key plus reward columns."""
    score: RewardFn
    description: str = ""
    make_demonstrations: Callable[[int, int], list[dict[str, Any]]] | None = None
    """``make_demonstrations(num, seed)`` -> ``{"prompt", "response"}`` records for sft (None: not offered)."""
    make_preferences: Callable[[int, int], list[dict[str, Any]]] | None = None
    """``make_preferences(num, seed)`` -> ``{"prompt", "chosen", "rejected"}`` records for reward_model / dpo."""


class UnknownTaskError(UserError, ValueError):
    """``data.task`` (or a ``data.tasks`` entry) names no task that can be generated."""
