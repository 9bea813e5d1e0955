"""A trajectory: the prompt, then every turn's tokens, with the loss mask that says which the policy wrote.

``response_ids`` holds everything after the prompt, in order: each assistant turn's tokens exactly as
the engine generated them (``response_mask`` 1, with the engine's log-prob in ``rollout_log_probs``),
and the tokens the policy did not write, tool outputs and the chat template's wrapper around them
(``response_mask`` 0, log-prob 0). The actor scores the whole sequence, so later turns see the tool
outputs as context, while the loss, the KL, the entropy and the advantages read mask-1 tokens only.

A trajectory has a token budget (``rollout.multi_turn.max_response_tokens``, the response's width in
the rollout batch): generated tokens are cut to it exactly, and context that does not fit with room
for at least one more generated token ends the trajectory instead (marked truncated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Trajectory", "response_width"]


def response_width(rollout: Mapping[str, Any]) -> int:
    """The response columns of a rollout batch: ``multi_turn.max_response_tokens`` for agent rollouts,
    else ``max_new_tokens`` (the one home of that rule)."""
    multi_turn = rollout["multi_turn"]
    return int(multi_turn["max_response_tokens"] if multi_turn["enable"] else rollout["max_new_tokens"])


@dataclass
class Trajectory:
    """One sample's conversation as tokens and as messages, and what happened in it."""

    prompt_ids: list[int]
    budget: int
    """Response tokens at most (``max_response_tokens``)."""
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The conversation after the prompt's own messages: assistant turns (with ``tool_calls``), tool or user turns."""
    reward_extra: dict[str, Any] = field(default_factory=dict)
    """Extra inputs of the reward function; ``tool_rewards`` (the sum of the tools' rewards) by default."""
    num_turns: int = 0
    """Assistant turns generated."""
    truncated: bool = False
    """Ended by a budget (``max_turns`` or ``max_response_tokens``) rather than by the model."""
    tool_calls: int = 0
    tool_errors: int = 0
    tool_latency_s: float = 0.0
    """Seconds spent in tool calls (or environment steps), summed over the calls."""
    tool_metrics: dict[str, list[float]] = field(default_factory=dict)
    """``<tool>/<key>`` -> the values of ``ToolResult.metrics`` over this trajectory's calls."""
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    """``(name, start, end)`` in ``time.time()`` seconds of each tool call, for the dispatch trace."""

    @property
    def budget_left(self) -> int:
        """Response tokens that still fit."""
        return self.budget - len(self.response_ids)

    def append_generated(self, token_ids: Sequence[int], log_probs: Sequence[float]) -> None:
        """Append an assistant turn's tokens as the engine gave them (mask 1), cut to the budget."""
        if len(token_ids) != len(log_probs):
            raise ValueError(f"{len(token_ids)} generated tokens but {len(log_probs)} log-probs")
        keep = max(0, min(len(token_ids), self.budget_left))
        if keep < len(token_ids):
            self.truncated = True
        self.response_ids.extend(int(token) for token in token_ids[:keep])
        self.response_mask.extend([1] * keep)
        self.rollout_log_probs.extend(float(value) for value in log_probs[:keep])

    def append_context(self, token_ids: Sequence[int]) -> bool:
        """Append tokens the policy did not write (mask 0) if they fit with room for one generated token
        after them; otherwise leave the trajectory as it is, mark it truncated and return False."""
        if len(token_ids) + 1 > self.budget_left:
            self.truncated = True
            return False
        self.response_ids.extend(int(token) for token in token_ids)
        self.response_mask.extend([0] * len(token_ids))
        self.rollout_log_probs.extend([0.0] * len(token_ids))
        return True

    @property
    def context_ids(self) -> list[int]:
        """Prompt and response so far: what the next turn is generated from."""
        return self.prompt_ids + self.response_ids

    @property
    def tool_rewards(self) -> float:
        """``reward_extra['tool_rewards']`` (0 when no tool gave a reward)."""
        return float(self.reward_extra.get("tool_rewards", 0.0))
