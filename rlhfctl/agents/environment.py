"""What a user writes for an interactive task: an :class:`Environment` the policy acts in, turn by turn.

``rollout.multi_turn.environment: {class: module:Class, config: {...}}``. One instance per
trajectory, built with ``config``. ``reset`` gets the sample's dataset columns and returns the first
observation; each assistant turn's text (tool-call markup and all) is one action, and ``step`` returns
the next observation, a reward and whether the episode is over.

Where the text goes:

- ``reset``'s observation **continues the prompt**: its tokens follow the prompt's own, before the
  first assistant turn (mask 0, no chat wrapper). Return ``""`` when the dataset prompt already says
  everything (the common case with chat prompts, whose rendering ends with the generation header).
- each ``step`` observation is a **user turn**, in the chat template's wrapper (mask 0), followed by the
  next generation header.
- the rewards of the steps are summed into ``tool_rewards``, which a reward function may take.

The episode ends when ``step`` says ``done``, at ``max_turns`` or when the token budget is spent (the
last two marked truncated). A ``step`` that raises or passes ``tool_timeout_s`` does not end the
step of training: the model reads the error as the observation, and it counts in ``agent/tool_errors``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Environment"]


class Environment:
    """Base class of a multi-turn environment: override ``reset`` and ``step``."""

    def __init__(self, **config: Any) -> None:
        self.config = dict(config)

    async def reset(self, **columns: Any) -> str:
        """Start an episode for one sample (its dataset columns); return the text that continues the prompt."""
        return ""

    async def step(self, action_text: str) -> tuple[str, float, bool]:
        """Take the assistant turn's text; return ``(observation, reward, done)``."""
        raise NotImplementedError(f"{type(self).__name__}.step")

    async def close(self) -> None:
        """Free the episode's resources (called once, whatever the outcome)."""
