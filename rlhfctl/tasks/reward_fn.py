"""The reward-function contract shared by every task and by user-supplied reward code.

A reward function is called once per batch::

    score(prompts: list[str], responses: list[str], **columns: list[Any]) -> list[float]

- ``prompts``: the decoded prompts (special tokens skipped), one per sample;
- ``responses``: the decoded responses (special tokens skipped, so no eos), one per sample;
- ``columns``: every extra dataset column (everything but the prompt), each a list aligned with
  ``prompts`` (e.g. ``ground_truth=[...]``); a function takes the ones it needs by name and
  accepts the rest through ``**columns``;
- returns one float per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["RewardFn", "check_reward_inputs"]


class RewardFn(Protocol):
    """Anything callable as ``fn(prompts, responses, **columns) -> list[float]``."""

    def __call__(self, prompts: list[str], responses: list[str], **columns: Any) -> list[float]: ...


def check_reward_inputs(prompts: Sequence[Any], responses: Sequence[Any], **columns: Sequence[Any]) -> None:
    """Reject batches whose prompts, responses and columns do not line up one per sample."""
    if len(prompts) != len(responses):
        raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses; they must pair up one to one")
    for name, values in columns.items():
        if len(values) != len(responses):
            raise ValueError(
                f"column {name!r} has {len(values)} values for {len(responses)} responses; "
                "every column must hold one value per sample"
            )
