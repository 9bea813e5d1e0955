"""Bundled tasks, generated at run time, that recipes name with ``data.task`` instead of files."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlhfctl.errors import UserError
from rlhfctl.tasks import arithmetic, digits, preferences
from rlhfctl.tasks.reward_fn import RewardFn, check_reward_inputs

__all__ = ["RewardFn", "Task", "UnknownTaskError", "check_reward_inputs", "get_task", "task_names"]


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
    """``data.task`` names no bundled task."""


_TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("digits", digits.make_prompts, digits.score, "reward = fraction of response characters that are digits",
             preferences.make_demonstrations, preferences.make_preferences),
        Task("copy", digits.make_prompts, digits.copy_score, "reward = partial credit for reproducing the digits"),
        Task("arithmetic", arithmetic.make_prompts, arithmetic.score,
             "reward = 1 when the final answer is the product; demonstrations call the calculator tool",
             arithmetic.make_demonstrations),
        Task("arithmetic-direct", arithmetic.make_prompts, arithmetic.score,
             "the arithmetic task with demonstrations that answer without the tool (the model-alone baseline)",
             arithmetic.make_direct_demonstrations),
    )
}


def task_names() -> list[str]:
    """Names accepted by :func:`get_task`, for help texts and error messages."""
    return sorted(_TASKS)


def get_task(name: str) -> Task:
    """Look up a bundled task by name (e.g. ``"digits"``)."""
    try:
        return _TASKS[name]
    except KeyError:
        raise UnknownTaskError(f"unknown task {name!r}; bundled tasks are: {', '.join(task_names())}") from None
