"""The reward an agent program returned, as a reward function: ``roles.reward.function:
rlhfctl.agents.endpoint.program_reward:program_reward``.

Every endpoint trajectory carries ``reward_extra`` with ``program_reward`` (the float the program returned, None
when it returned None or failed) and ``endpoint_error`` (why it failed, None otherwise); ``tool_rewards`` holds the
program's float too (0 when None or failed), for reward functions that already read it. This function returns the
program's float, and 0 for a failed run; a run that returned None needs a reward function that scores the
trajectory itself (it can fall back on ``reward_extra["program_reward"]`` where it is not None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["program_reward"]


def program_reward(prompts: Sequence[str], responses: Sequence[str], reward_extra: Sequence[Mapping[str, Any]], **columns: Any) -> list[float]:
    """The programs' own rewards, 0 for a failed run; ValueError for a run that returned None."""
    scores = []
    for index, extra in enumerate(reward_extra):
        extra = dict(extra or {})
        if extra.get("endpoint_error") is not None:
            scores.append(0.0)
        elif extra.get("program_reward") is None:
            raise ValueError(
                f"sample {index}: the agent program returned None and program_reward has nothing to return; return a float "
                "from the program, or set roles.reward.function to a function that scores the trajectory"
            )
        else:
            scores.append(float(extra["program_reward"]))
    return scores
